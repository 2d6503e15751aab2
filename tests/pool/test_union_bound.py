"""Pool mode's bound of task and space plans alike: each job alone, the pooled speed and
the joint LP on pool rates."""

from __future__ import annotations

import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool
from hetsched.planning.pool.lp_union import rate_bound
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.union_bound import seconds_per_sample, union_bound


def _queue(n: int = 6) -> PlanningProblem:
    """n equal jobs at t = 0 on one node of 2 GPUs: each alone would take the node, so
    together they queue; only a bound that sees the node's capacity sees the queue."""
    rows = [ProfileRow("w", "v100", b, 0.004 + 0.001 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=64 * 300, epochs=1, global_batch=64)
            for k in range(n)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2),)),
                           ThroughputTable(rows, "<queue>"))


def test_the_pooled_speed_sees_a_queue_that_each_job_alone_does_not() -> None:
    p = _queue()
    pp = PoolProblem(p)
    value, parts = union_bound(p, pp)
    assert parts["pooled"] > 2 * parts["alone"]  # six jobs share what each alone would have
    assert value == max(parts.values())
    plan = plan_pool(p, "hare")
    assert plan.lower_bound_s == pytest.approx(value)
    assert "pooled speed" in plan.lower_bound_extra["kind"]
    # below every plan: the task plan, the paper's pool model alone, the space plan
    for other in (plan, plan_pool(p, "hare", {"space": "off"}), plan_problem(p, "auto")):
        assert value <= other.weighted_jct_s * (1 + 1e-9)
    # and close to the plan here (a queue on one node is what it models)
    assert value >= 0.7 * plan.weighted_jct_s


def test_a_sample_costs_at_least_the_best_local_batchs_share_of_an_iteration() -> None:
    """u_t: the least pool-iteration seconds per sample over the batches a GPU may hold;
    on a line with an intercept, the largest batch (the cap)."""
    p = _queue(1)
    pp = PoolProblem(p)
    u = seconds_per_sample(p, pp, 0)
    cap = int(p.cap[0, 0])
    step = float(p.step_times(0, [[float(cap)]])[0, 0])
    assert u[0] == pytest.approx(max(step - float(pp.optimizer_s[0, 0]), 0.05 * step) / cap)


def _two_types(n: int, every_s: float) -> PlanningProblem:
    """n equal jobs, one every ``every_s`` seconds, on 2 fast GPUs and 4 ten times slower:
    they contend for the fast two, which the pooled speed prices but does not place."""
    rows = [ProfileRow("w", "v100", b, 0.004 + 0.001 * b, 0.0) for b in (8, 64)] + \
           [ProfileRow("w", "k80", b, 0.02 + 0.01 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=64 * 300, epochs=1, global_batch=64,
                arrival_s=every_s * k) for k in range(n)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2),
                                                Node("k80-1", "k80", 4))),
                           ThroughputTable(rows, "<two types>"))


@pytest.mark.parametrize(("n", "every_s"), [(4, 0.0), (4, 5.0), (6, 3.0)])
def test_the_joint_lp_sees_which_gpus_the_jobs_contend_for(n: int, every_s: float) -> None:
    """On the model of one step's slice a pass (``fuse=False``), where a job spread over
    GPUs runs each at a small batch: the LP sees both that and the contended GPUs."""
    p = _two_types(n, every_s)
    value, parts = union_bound(p, PoolProblem(p, fuse=False))
    assert value == parts["lp"] >= 1.08 * max(parts["alone"], parts["pooled"])
    plans = [plan_pool(p, "hare", fuse=False), plan_pool(p, "hare", {"space": "off"}, fuse=False),
             plan_pool(p, "pool-fifo", fuse=False), plan_pool(p, "pool-srtf", fuse=False),
             plan_problem(p, "auto"), plan_problem(p, "exhaustive", restart_cost_s=0.0)]
    for plan in plans:
        assert value <= plan.weighted_jct_s * (1 + 1e-9), plan.policy
    assert plans[0].lower_bound_s == pytest.approx(value)
    assert "joint LP" in plans[0].lower_bound_extra["kind"]


def test_a_jobs_rate_on_gpus_at_once_is_bounded_by_its_global_batch() -> None:
    """The rate bound is the best split of the global batch over the GPUs (exact for an
    affine step): each V100 alone at its best local batch; on two, the batch split in
    half; never more than the sum of the peaks, and growing with every GPU."""
    import numpy as np

    p = _two_types(1, 0.0)
    pp = PoolProblem(p, fuse=False)
    v, k = p.types.index("v100"), p.types.index("k80")
    X = np.zeros((4, p.T), dtype=int)
    X[0, v], X[1, v], X[2, v], X[3, [v, k]] = 1, 2, 2, (2, 4)
    X[2, k] = 1
    r = rate_bound(p, pp, 0, X)

    def it(b: float, t: int) -> float:
        s = float(p.step_times(0, [[float(b)] * p.T])[0, t])
        return max(s - float(pp.optimizer_s[0, t]), 0.05 * s)

    assert r[0] == pytest.approx(64 / it(64, v), rel=1e-3)  # the whole batch on one
    assert r[1] == pytest.approx(2 * 32 / it(32, v), rel=2e-2)  # halves on two
    assert r[1] < 2 * r[0]  # a split batch runs each GPU less efficiently
    assert r[0] < r[1] <= r[2] <= r[3]


@pytest.mark.parametrize(("n", "every_s"), [(4, 0.0), (6, 3.0)])
def test_with_fused_passes_the_bound_stays_below_every_plan(n: int, every_s: float) -> None:
    """A fused pass holds several steps' slices, so a GPU may run at its peak whatever
    its slice: the rate bound is the sum of the peaks, and the bound of every kind stays
    below the fused task plans and the space plans."""
    import numpy as np

    p = _two_types(n, every_s)
    pp = PoolProblem(p)
    assert (pp.chunk > 1).any()
    v, k = p.types.index("v100"), p.types.index("k80")
    X = np.zeros((2, p.T), dtype=int)
    X[0, v], X[1, [v, k]] = 2, (2, 4)
    peak = 1.0 / seconds_per_sample(p, pp, 0)
    assert rate_bound(p, pp, 0, X) == pytest.approx(X @ peak)
    value, parts = union_bound(p, pp)
    plans = [plan_pool(p, "hare"), plan_pool(p, "hare", {"space": "off"}),
             plan_pool(p, "pool-fifo"), plan_pool(p, "pool-srtf"), plan_problem(p, "auto")]
    for plan in plans:
        assert value <= plan.weighted_jct_s * (1 + 1e-9), plan.policy
    # fused passes run the same tasks no slower: pool mode's plan is not above the
    # unfused one
    assert plans[0].weighted_jct_s <= plan_pool(p, "hare", fuse=False).weighted_jct_s * (1 + 1e-9)


def test_a_job_that_may_use_thousands_of_gpus_gets_boxes_not_every_count(monkeypatch) -> None:
    """On 3 x 1,200 GPUs a job's count vectors are billions: its columns are boxes of them
    (at most ``MAX_BOXES``), and their Pareto set is found on the boxes' grid indices,
    never on an array as large as the counts (1,201^3 marks: gigabytes)."""
    import numpy as np

    from hetsched.planning import lp_configs
    from hetsched.planning.pool import lp_union

    rows = [ProfileRow("w", t, b, s + s * b / 16, 0.0) for t, s in
            (("v100", 0.01), ("p100", 0.02), ("k80", 0.04)) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=4096 * 50, epochs=1,
                global_batch=4096, arrival_s=100.0 * k) for k in range(2)]
    nodes = tuple(Node(f"{t}-{n}", t, 8) for t in ("v100", "p100", "k80") for n in range(150))
    p = PlanningProblem(jobs, Cluster(nodes=nodes), ThroughputTable(rows, "<wide>"))
    lo, up, idx = lp_union._boxes(p, 0)
    assert len(lo) <= lp_union.MAX_BOXES and (lo <= up).all() and (up <= 1200).all()
    seen: list[int] = []
    real = lp_configs.pareto_configs

    def spy(q, i, X, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(int(np.max(X)))
        return real(q, i, X, *a, **k)

    monkeypatch.setattr(lp_configs, "pareto_configs", spy)
    lp = lp_union.pool_lp_bound(p, PoolProblem(p))
    assert lp is not None and seen and max(seen) <= int(idx.max())
