"""The pooled machine's inequalities as cuts of the joint LP: separation by hand, and the
LP with them never below the pooled bound it takes them from, never above a plan."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from hetsched.api import load_profiles
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.io.specs import load_cluster, load_jobs
from hetsched.planning.bounds import lower_bound
from hetsched.planning.lp_pooled_cuts import PooledCuts, asap_prefixes
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import plan_pool
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.union_bound import union_bound
from hetsched.planning.pooled_bound import wspt_mean_busy


def _cuts(q: list[float], half: list[float], a: list[float], mult: list[int],
          w: list[float] | None = None) -> PooledCuts:
    return PooledCuts(q=np.array([q], dtype=float), half=np.array(half, dtype=float),
                      a=np.array(a, dtype=float), w=np.array(w or [1.0] * len(q)),
                      mult=np.array(mult))


def _brute_asap(q: list[float], a: list[float], dt: float = 1e-3) -> float:
    """int t dt over the busy time of the jobs run as soon as they arrive, step by step."""
    left, t, total = list(q), 0.0, 0.0
    while sum(left) > 1e-9:
        ready = [i for i in range(len(q)) if a[i] <= t + 1e-12 and left[i] > 1e-12]
        if not ready:
            t = min(a[i] for i in range(len(q)) if left[i] > 1e-12)
            continue
        step = min(dt, left[ready[0]])
        total += (t + step / 2) * step
        left[ready[0]] -= step
        t += step
    return total


def test_each_prefix_packs_its_work_as_soon_as_it_arrives() -> None:
    rng = random.Random(1)
    for _ in range(60):
        n = rng.randint(1, 6)
        q = [rng.choice([0.0, 0.25, 0.5, 1.0, 2.0]) for _ in range(n)]
        a = [rng.choice([0.0, 0.0, 1.0, 2.5, 3.0, 5.0]) for _ in range(n)]
        f = asap_prefixes(np.array(q), np.array(a))
        for k in range(n):
            assert f[k] == pytest.approx(_brute_asap(q[:k + 1], a[:k + 1]), abs=1e-6)


def test_two_jobs_that_cannot_both_start_at_once_give_one_cut() -> None:
    """Two jobs of 1 s each on the pooled machine, both at 0, each claiming a mean busy
    time of 0.5: together they need sum q M >= int_0^2 t dt = 2, so the pair is cut."""
    cuts = _cuts([1.0, 1.0], [0.25, 0.25], [0.0, 0.0], [1, 1])
    found = cuts.violated(np.array([0.75, 0.75]))  # C - P/2 = 0.5 each
    assert len(found) == 1
    terms, lower = found[0]
    assert dict(terms) == {0: 1.0, 1: 1.0}
    assert lower == pytest.approx(2.0 + 0.25 + 0.25)
    # a schedule's completions (one after the other: M = 0.5 and 1.5) meet every inequality
    assert cuts.violated(np.array([0.75, 1.75])) == []


def test_work_that_arrives_late_is_packed_from_its_arrival() -> None:
    """Two jobs arriving at 10 cannot run before 10: with the job of t = 0 the set needs
    int_0^1 t dt + int_10^12 t dt = 22.5, where packing from the set's first arrival
    would ask only 4.5."""
    cuts = _cuts([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 10.0, 10.0], [1, 1, 1])
    found = cuts.violated(np.array([0.5, 10.5, 10.5]))
    terms, lower = found[0]
    assert dict(terms) == {0: 1.0, 1: 1.0, 2: 1.0}
    assert lower == pytest.approx(22.5)


def test_a_class_of_identical_jobs_counts_each_member() -> None:
    """Three identical jobs share one column: the set of all three has coefficient 3q."""
    cuts = _cuts([1.0], [0.0], [0.0], [3])
    terms, lower = cuts.violated(np.array([0.5]))[0]  # the most violated first
    assert dict(terms) == {0: 3.0}
    assert lower == pytest.approx(4.5)  # int_0^3 t dt


def test_the_chain_follows_weight_over_time_and_its_dual_is_the_pooled_bound() -> None:
    """The chain's sets are the prefixes in w / q order, and the LP over them alone is
    preemptive WSPT on the pooled machine (Goemans): here job 1 (w / q = 3) first."""
    cuts = _cuts([1.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1, 1], w=[1.0, 3.0])
    chain = cuts.chains()
    assert [dict(t) for t, _ in chain] == [{1: 1.0}, {0: 1.0, 1: 1.0}]
    assert [lower for _, lower in chain] == pytest.approx([0.5, 2.0])
    # min w.M s.t. the chain: M1 = 0.5, M0 = 1.5, WSPT's mean busy times
    value = wspt_mean_busy(np.array([1.0, 3.0]), np.array([1.0, 1.0]), np.zeros(2))
    assert list(value) == pytest.approx([1.5, 0.5])


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example() -> PlanningProblem:
    return PlanningProblem(load_jobs(EXAMPLES / "jobs.yaml"), load_cluster(EXAMPLES / "cluster.yaml"),
                           load_profiles(str(EXAMPLES / "gavel_throughputs.csv")))


def test_the_pool_lp_with_the_cuts_is_at_least_the_pooled_bound_and_below_plans() -> None:
    """On the bundled example pool mode's LP alone is below the pooled speed (1,308 s
    against 1,444 s: it prices each interval's work from the interval's start, where the
    pooled machine queues the jobs); with the pooled inequalities it is above it."""
    p = _example()
    pp = PoolProblem(p)
    value, parts = union_bound(p, pp)
    assert parts["lp"] >= parts["pooled"] * (1 - 1e-6)
    assert value == parts["lp"]
    for plan in (plan_pool(p, "hare"), plan_pool(p, "hare", {"space": "off"}),
                 plan_problem(p, "auto")):
        assert value <= plan.weighted_jct_s * (1 + 1e-9)


def _queue(n: int = 6) -> PlanningProblem:
    """n jobs of growing size at t = 0 on one node of 2 GPUs: they queue."""
    rows = [ProfileRow("w", "v100", b, 0.004 + 0.001 * b, 0.0) for b in (8, 64)]
    jobs = [Job(name=f"j{k}", workload="w", dataset_size=64 * 300 * (k + 1), epochs=1,
                global_batch=64) for k in range(n)]
    return PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 2),)),
                           ThroughputTable(rows, "<queue>"))


def test_the_space_lp_with_the_cuts_is_at_least_the_pooled_bound_and_below_plans() -> None:
    p = _queue()
    value = lower_bound(p)
    vals = p.estimates.extra["lower_bounds"]
    assert vals["lp"] >= vals["pooled"] * (1 - 1e-3)
    for policy in ("auto", "exhaustive", "srtf"):
        assert value <= plan_problem(p, policy).weighted_jct_s * (1 + 1e-9)
