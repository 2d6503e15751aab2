"""The iteration-time memos of the baselines and of HAS/JPS's trim give the computed values.

``equal_iter_time`` (fifo, srtf, allox, las) is memoised per problem;
``has_trim.lattice_times`` keeps a box of iteration times per job model across
events. Both must return exactly what computing afresh returns, whatever order
the lattices are asked in, and plans must not depend on how much is kept.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies import common, has_trim
from hetsched.planning.space.policies.jps import JPS
from tests.planner_helpers import instances, make_cluster, make_job, make_table


def _problem():
    from hetsched.core.problem import PlanningProblem

    table = make_table({("w", "v100"): (0.05, 0.004, 64), ("w", "k80"): (0.1, 0.02, 32),
                        ("w", "p100"): (0.08, 0.008, 48), ("u", "v100"): (0.2, 0.001, 64),
                        ("u", "k80"): (0.3, 0.003, 64)})
    cluster = make_cluster([("a", "v100", 4), ("b", "v100", 4), ("c", "k80", 4),
                            ("d", "p100", 3)])
    jobs = [make_job("j0", "w", global_batch=64), make_job("j1", "w", global_batch=64),
            make_job("j2", "u", global_batch=128), make_job("j3", "w", global_batch=32)]
    return PlanningProblem(jobs, cluster, table)


def _states(dims):
    return np.array(np.unravel_index(np.arange(int(np.prod(dims))), dims)).T


def test_lattice_times_equal_iter_time_in_any_order(monkeypatch) -> None:
    p = _problem()
    monkeypatch.setattr(has_trim, "LATTICE_CACHE_POINTS", 200)  # forces evictions too
    rng = np.random.default_rng(0)
    for _ in range(60):
        i = int(rng.integers(p.S))
        dims = tuple(int(rng.integers(1, n + 2)) for n in p.n_type)
        states = _states(dims)
        got = has_trim.lattice_times(p, i, dims, states)
        np.testing.assert_array_equal(got, p.iter_time(i, states))
    kept = p.estimates.extra["trim_lattice"]
    # the box just used stays even when it alone is over the limit; the others go first
    assert sum(v.size for _, v in kept.values()) <= 200 or len(kept) == 1


def test_jobs_of_one_model_share_a_box() -> None:
    p = _problem()
    assert has_trim.model_key(p, 0) == has_trim.model_key(p, 1)  # same workload and batch
    assert has_trim.model_key(p, 0) != has_trim.model_key(p, 3)  # another batch
    assert has_trim.model_key(p, 0) != has_trim.model_key(p, 2)  # another workload
    dims = tuple(int(n) + 1 for n in p.n_type)
    has_trim.lattice_times(p, 0, dims, _states(dims))
    has_trim.lattice_times(p, 1, dims, _states(dims))
    assert len(p.estimates.extra["trim_lattice"]) == 1


def test_a_box_grows_only_up_to_the_table_size(monkeypatch) -> None:
    p = _problem()
    monkeypatch.setattr(has_trim, "TRIM_TABLE_MAX", 20)
    key = has_trim.model_key(p, 0)
    boxes = []
    for dims in ((2, 2, 3), (3, 2, 2), (2, 3, 3)):  # 12, 12, 18 points (the caller's limit)
        got = has_trim.lattice_times(p, 0, dims, _states(dims))
        np.testing.assert_array_equal(got, p.iter_time(0, _states(dims)))
        boxes.append(p.estimates.extra["trim_lattice"][key][0])
    # (2,2,3) then their box (3,2,3); (3,3,3) would be 27 points: the last lattice alone
    assert boxes == [(2, 2, 3), (3, 2, 3), (2, 3, 3)]


def test_equal_iter_time_memo_is_the_computed_value() -> None:
    p = _problem()
    for i in range(p.S):
        for n in _states(tuple(int(k) + 1 for k in p.n_type))[::7]:
            first = common.equal_iter_time(p, i, n)
            assert first == common._equal_iter_time(p, i, n)
            assert common.equal_iter_time(p, i, n) == first  # from the memo


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=5, max_gpus=10))
def test_jps_plans_do_not_depend_on_the_lattice_memo(inst) -> None:
    p = inst.problem()
    kept = simulate(p, JPS(samples=8), restart_cost_s=0.0)
    q = inst.problem()
    old = has_trim.LATTICE_CACHE_POINTS
    has_trim.LATTICE_CACHE_POINTS = 0  # only the box just used is kept
    try:
        fresh = simulate(q, JPS(samples=8), restart_cost_s=0.0)
    finally:
        has_trim.LATTICE_CACHE_POINTS = old
    assert [j.to_dict() for j in kept.jobs] == [j.to_dict() for j in fresh.jobs]
    assert kept.weighted_jct_s == fresh.weighted_jct_s
