"""``harmony-jct``: co-location only where it lowers predicted weighted JCT (docs/harmony.md)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_helpers import check_plan, make_cluster, make_job, make_table
from test_harmony import check_groups, coloc_instances

from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError
from hetsched.planning.planner import plan_problem
from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies import make_policy
from hetsched.planning.space.policies.harmony_jct import pair_gain


@pytest.mark.slow
@given(coloc_instances(), st.sampled_from(["has", "fifo"]))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_never_worse_than_its_isolated_base(p: PlanningProblem, base: str) -> None:
    own = simulate(p, make_policy("harmony-jct", {"base": base}))
    check_plan(p, own)  # the co-located plan itself is feasible (memory, shared GPUs)
    check_groups(p, own)
    iso = plan_problem(p, base)
    best = plan_problem(p, "harmony-jct", {"base": base})
    check_plan(p, best)
    assert best.weighted_jct_s <= iso.weighted_jct_s + 1e-9
    assert best.weighted_jct_s == pytest.approx(min(own.weighted_jct_s, iso.weighted_jct_s))
    assert best.notes.fallback["kept"] in ("own", "base")


def _waiting_comm_beside_running_comp() -> PlanningProblem:
    # 2 nodes x 2 GPUs at 10 Gbit/s; both jobs need all 4 GPUs. "comp": COMP 0.72 s,
    # tiny model; "comm" (arrives later, longer, so it waits): 600 MB all-reduce across
    # nodes (~0.72 s), COMP 0.016 s
    cl = make_cluster([("n0", "v100", 2), ("n1", "v100", 2)], 100.0, 10.0)
    tab = make_table({("comp", "v100"): (0.0, 0.045, 64), ("comm", "v100"): (0.0, 0.001, 64)})
    jobs = [make_job("c", "comp", global_batch=64, dataset_size=64 * 400, model_size_mb=10.0,
                     min_gpus=4),
            make_job("m", "comm", global_batch=64, dataset_size=64 * 600, model_size_mb=600.0,
                     min_gpus=4, arrival_s=5.0)]
    return PlanningProblem(jobs, cl, tab)


def test_grouping_a_waiting_comm_job_with_a_running_comp_job_helps() -> None:
    p = _waiting_comm_beside_running_comp()
    iso = plan_problem(p, "has")
    plan = plan_problem(p, "harmony-jct")
    check_plan(p, plan)
    assert check_groups(p, plan) > 0
    assert plan.notes.fallback["kept"] == "own"
    assert plan.weighted_jct_s < 0.9 * iso.weighted_jct_s
    end = {j.name: j.segments[-1].end_s for j in plan.jobs}
    iso_end = {j.name: j.segments[-1].end_s for j in iso.jobs}
    iso_m = next(j for j in iso.jobs if j.name == "m")
    assert iso_m.segments[0].start_s > 200.0  # isolated: the comm-heavy job waits for c
    m = next(j for j in plan.jobs if j.name == "m")
    assert m.segments[0].start_s == pytest.approx(5.0)  # grouped: it starts at arrival
    assert m.segments[0].group is not None
    assert end["m"] < iso_end["m"] and end["c"] < 1.01 * iso_end["c"]  # c hardly slows


def test_pair_gain_signs() -> None:
    # complementary: group iteration = alone iteration -> the wait is saved
    assert pair_gain(1, 100, 0.7, 0.7, 1, 100, 0.7, 0.7, wait=50.0) == pytest.approx(50.0)
    # a pair 4x slower than alone for the running job is not worth a short wait
    assert pair_gain(1, 100, 0.2, 0.8, 1, 100, 0.7, 0.8, wait=5.0) < 0


def test_base_must_be_isolated() -> None:
    with pytest.raises(InputError, match="base must be an isolated"):
        make_policy("harmony-jct", {"base": "harmony"})
