"""The iteration-time memos of the baselines and of HAS/JPS's trim give the computed values.

``equal_iter_time`` (fifo, srtf, allox, las) is memoised per problem;
``has_trim.sub_table`` keeps each job model's trim table across a policy run's
events, in a box that grows. Both must return exactly what computing afresh returns (ties
included), whatever order the lattices are asked in, and plans must not
depend on how much is kept.
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
            make_job("j2", "u", global_batch=128), make_job("j3", "w", global_batch=32),
            make_job("j4", "w", global_batch=64, min_gpus=3)]
    return PlanningProblem(jobs, cluster, table)


def _states(dims):
    return np.array(np.unravel_index(np.arange(int(np.prod(dims))), dims)).T


def _fresh(p, i, dims, lo):
    """The table of the lattice ``dims`` alone: what each event computed before."""
    states = _states(dims)
    f = p.iter_time(i, states)
    f[states.sum(axis=1) < lo] = np.inf
    V, idx = has_trim._sweep(f.reshape(dims))
    return V, idx


def _brute(p, i, dims, lo):
    """Least iteration time of any y <= x with at least lo GPUs, for every x of ``dims``."""
    states = _states(dims)
    f = p.iter_time(i, states)
    f[states.sum(axis=1) < lo] = np.inf
    return np.array([f[(states <= x).all(axis=1)].min() for x in states])


def test_kept_tables_equal_fresh_ones_in_any_order(monkeypatch) -> None:
    p = _problem()
    monkeypatch.setattr(has_trim, "TABLE_CACHE_BYTES", 6000)  # some boxes are not kept
    rng = np.random.default_rng(0)
    tables = has_trim.TrimTables()
    for _ in range(80):
        i = int(rng.integers(p.S))
        lo = int(p.lo[i])
        dims = tuple(int(rng.integers(1, n + 2)) for n in p.n_type)
        V, idx, box = has_trim.sub_table(p, i, dims, lo, tables)
        Vf, idxf = _fresh(p, i, dims, lo)
        inside = tuple(slice(0, d) for d in dims)
        np.testing.assert_array_equal(V[inside], Vf)
        # the same best y (ties broken alike), as counts
        got = np.array(np.unravel_index(idx[inside].ravel(), box)).T
        want = np.array(np.unravel_index(idxf.ravel(), dims)).T
        np.testing.assert_array_equal(got, want)
    assert 0 < has_trim._kept_bytes(tables.boxes) <= 6000


def test_the_table_is_the_best_sub_allocation() -> None:
    p = _problem()
    for i in (0, 2, 4):
        dims = tuple(int(n) + 1 for n in p.n_type)
        V, _, _ = has_trim.sub_table(p, i, dims, int(p.lo[i]), has_trim.TrimTables())
        np.testing.assert_array_equal(V.ravel(), _brute(p, i, dims, int(p.lo[i])))


def test_jobs_of_one_model_share_a_box_and_each_minimum_has_its_table() -> None:
    p = _problem()
    assert p.model_key(0) == p.model_key(1)  # same workload and batch
    assert p.model_key(0) == p.model_key(4)  # min_gpus is not the model
    assert p.model_key(0) != p.model_key(3)  # another batch
    assert p.model_key(0) != p.model_key(2)  # another workload
    dims = tuple(int(n) + 1 for n in p.n_type)
    tables = has_trim.TrimTables()
    for i in (0, 1, 4):
        has_trim.sub_table(p, i, dims, int(p.lo[i]), tables)
    kept = tables.boxes
    assert len(kept) == 1
    # the box's iteration times computed once per minimum (a box that covers the
    # partition drops its times once its table is built), not once per job
    assert tables.points == 2 * int(np.prod(dims))
    box = next(iter(kept.values()))
    assert sorted(box.tables) == [1, 3]
    assert box.F is None  # the box covers the partition: its times are dropped
    V, _, _ = has_trim.sub_table(p, 4, dims, 3, tables)
    np.testing.assert_array_equal(V.ravel(), _brute(p, 4, dims, 3))


def test_a_box_grows_only_up_to_the_table_size(monkeypatch) -> None:
    p = _problem()
    monkeypatch.setattr(has_trim, "TRIM_TABLE_MAX", 20)
    boxes = []
    tables = has_trim.TrimTables()
    for dims in ((2, 2, 3), (3, 2, 2), (2, 3, 3)):  # 12, 12, 18 points (the caller's limit)
        V, _, box = has_trim.sub_table(p, 0, dims, 1, tables)
        np.testing.assert_array_equal(V[tuple(slice(0, d) for d in dims)], _fresh(p, 0, dims, 1)[0])
        boxes.append(box)
    # (2,2,3) then their box (3,2,3); (3,3,3) would be 27 points: the last lattice alone
    assert boxes == [(2, 2, 3), (3, 2, 3), (2, 3, 3)]
    # counted: 12, then the 6 new points of (3,2,3), then 18 (built, not kept)
    assert tables.points == 12 + 6 + 18


def test_equal_iter_time_memo_is_the_computed_value() -> None:
    p = _problem()
    for i in range(p.S):
        for n in _states(tuple(int(k) + 1 for k in p.n_type))[::7]:
            first = common.equal_iter_time(p, i, n)
            assert first == common._equal_iter_time(p, i, n)
            assert common.equal_iter_time(p, i, n) == first  # from the memo


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=5, max_gpus=10))
def test_jps_plans_do_not_depend_on_the_kept_tables(inst) -> None:
    p = inst.problem()
    kept = simulate(p, JPS(samples=8), restart_cost_s=0.0)
    q = inst.problem()
    old = has_trim.TABLE_CACHE_BYTES
    has_trim.TABLE_CACHE_BYTES = 0  # none kept: each event builds its own tables
    try:
        fresh = simulate(q, JPS(samples=8), restart_cost_s=0.0)
    finally:
        has_trim.TABLE_CACHE_BYTES = old
    assert [j.to_dict() for j in kept.jobs] == [j.to_dict() for j in fresh.jobs]
    assert kept.weighted_jct_s == fresh.weighted_jct_s


def test_a_runs_counted_work_holds_the_tables_it_builds_and_no_other_runs(
        monkeypatch) -> None:
    """auto's budget counts the trim tables' lattice points: a run that must rebuild its
    tables at every event (none kept: many job models) counts more, and a run counts the
    same whatever another run in the same process kept before it (tables are per run)."""
    p = _problem()
    first = simulate(p, JPS(samples=8), restart_cost_s=0.0)
    again = simulate(p, JPS(samples=8), restart_cost_s=0.0)  # same process, same problem
    assert again.work[0] == first.work[0]
    monkeypatch.setattr(has_trim, "TABLE_CACHE_BYTES", 0)  # every event builds its tables
    fresh = simulate(_problem(), JPS(samples=8), restart_cost_s=0.0)
    assert fresh.work[0] > first.work[0]
    assert [j.to_dict() for j in fresh.jobs] == [j.to_dict() for j in first.jobs]
    # the difference is lattice points at POINT_S each
    extra = (fresh.work[0] - first.work[0]) / has_trim.POINT_S
    assert abs(extra - round(extra)) < 1e-3 and extra >= 1
