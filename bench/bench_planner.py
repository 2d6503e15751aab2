"""Planner benchmarks: planning time and quality against the HAS paper's tables.

Run: python bench/bench_planner.py [--quick] [--out docs/bench_planner.json]

Scenarios (all on Gavel's measured throughputs, examples/gavel_throughputs.csv):

A. Paper Table IV: S=4 jobs on K=15 and K=30 GPUs, V100:P100:K80 = 1:1:1,
   5 GPUs per node, 300 Gbit/s inside a node and 10 Gbit/s between nodes.
   Single placement (the paper's ART: one call at t=0) and the gap of its
   predicted average JCT to exhaustive's; then the full plan with reset events.
B. Paper Table V: S=4 on K=50..300: JPS (N=40) single-placement time.
C. Scale: 1,000 jobs on 1,000 GPUs planned by optimus-lb (one placement and the
   whole timeline).
D. Gavel trace with arrivals: auto against fifo, homo and allox.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
from gavel_data import MISSING, TRACES  # noqa: E402

sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Node  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402
from hetsched.io.traces import parse_trace  # noqa: E402
from hetsched.planning.planner import plan_problem  # noqa: E402
from hetsched.planning.space.policies.base import Snapshot, make_policy  # noqa: E402

TABLE = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")

# Four of Gavel's workloads, sized like the HAS paper's Table III jobs.
PAPER_JOBS = [
    dict(name="resnet50", workload="resnet-50", dataset_size=50_000, epochs=20, global_batch=128,
         model_size_mb=98),
    dict(name="resnet18", workload="resnet-18", dataset_size=100_000, epochs=20, global_batch=256,
         model_size_mb=45),
    dict(name="transformer", workload="transformer", dataset_size=36_718, epochs=3,
         global_batch=64, model_size_mb=250),
    dict(name="lm", workload="lm", dataset_size=200_000, epochs=2, global_batch=80,
         model_size_mb=120),
]


def cluster(k: int, per_node: int = 5, mix: tuple[str, ...] = ("v100", "p100", "k80")) -> Cluster:
    """k GPUs split evenly over the types, nodes of `per_node` GPUs."""
    nodes = []
    base = k // len(mix)
    counts = [base + (1 if i < k - base * len(mix) else 0) for i in range(len(mix))]
    for t, n in zip(mix, counts, strict=True):
        idx = 0
        while n > 0:
            g = min(per_node, n)
            nodes.append(Node(f"{t}-{idx}", t, g))
            n -= g
            idx += 1
    return Cluster(nodes=tuple(nodes), intra_node_gbps=300.0, inter_node_gbps=10.0)


def first_placement(problem: PlanningProblem, policy: str, **params: object) -> tuple[float, float]:
    """(seconds, predicted weighted completion) of one placement of all jobs at t=0."""
    pol = make_policy(policy, dict(params))
    problem.clear_caches()  # time a cold placement, as a fresh `hetsched plan` would
    S = problem.S
    snap = Snapshot(t=0.0, jobs=np.arange(S), remaining=problem.iters.copy(),
                    free=problem.n_type.copy(), current=np.zeros((S, problem.T), dtype=int),
                    waited=np.zeros(S))
    t0 = time.perf_counter()
    X = pol.allocate(problem, snap)
    dt = time.perf_counter() - t0
    obj = 0.0
    for i in range(S):
        if X[i].sum():
            obj += problem.weight[i] * problem.iters[i] * problem.iter_time(i, X[i][None])[0]
        else:
            obj = float("inf")
    return dt, obj


def timed_plan(problem: PlanningProblem, policy: str, **kw: object):  # type: ignore[no-untyped-def]
    problem.clear_caches()
    t0 = time.perf_counter()
    plan = plan_problem(problem, policy, **kw)  # type: ignore[arg-type]
    return time.perf_counter() - t0, plan


def scenario_a(out: dict, quick: bool) -> None:
    jobs = parse_jobs(PAPER_JOBS, "bench")
    for k in (15, 30):
        prob = PlanningProblem(jobs, cluster(k), TABLE)
        row: dict[str, object] = {}
        ref_t, ref = first_placement(prob, "exhaustive")
        row["exhaustive"] = {"time_s": ref_t, "objective": ref}
        for label, name, params in [
                ("has", "has", {}),
                ("has as in the paper (raw P3, no trim)", "has", {"matching": "raw", "trim": False}),
                ("jps N=20", "jps", {"samples": 20}), ("jps N=40", "jps", {"samples": 40}),
                ("jps N=60", "jps", {"samples": 60}),
                ("jps N=40 as in the paper (raw P3, no trim)", "jps",
                 {"samples": 40, "matching": "raw", "trim": False}),
                ("optimus", "optimus", {}), ("optimus-lb", "optimus-lb", {})]:
            reps = [first_placement(prob, name, **params) for _ in range(1 if quick else 3)]
            dt = min(r[0] for r in reps)
            row[label] = {"time_s": dt, "objective": reps[0][1], "gap": reps[0][1] / ref - 1}
        full: dict[str, object] = {}
        plans = {}
        for name in ("exhaustive", "has", "jps", "optimus-lb", "optimus", "fifo", "srtf",
                     "allox", "homo", "auto"):
            dt, plan = timed_plan(prob, name)
            plans[name] = plan
            full[name] = {"time_s": dt, "weighted_jct_s": plan.weighted_jct_s,
                          "lower_bound_s": plan.lower_bound_s}
        ex = plans["exhaustive"].weighted_jct_s
        for name, d in full.items():
            d["gap_to_exhaustive"] = plans[name].weighted_jct_s / ex - 1  # type: ignore[index]
        out[f"A_K{k}"] = {"single_placement": row, "timeline": full}


def scenario_b(out: dict, quick: bool) -> None:
    jobs = parse_jobs(PAPER_JOBS, "bench")
    res = {}
    for k in (50, 100, 200, 300):
        prob = PlanningProblem(jobs, cluster(k), TABLE)
        reps = [first_placement(prob, "jps", samples=40) for _ in range(1 if quick else 3)]
        o_t, o = first_placement(prob, "optimus-lb")
        res[f"K{k}"] = {"jps_N40_time_s": min(r[0] for r in reps), "jps_objective": reps[0][1],
                        "optimus_lb_time_s": o_t, "optimus_lb_objective": o}
    out["B"] = res


def scenario_c(out: dict, quick: bool) -> None:
    rng = np.random.default_rng(0)
    wls = ["resnet-18", "resnet-50", "transformer", "lm", "recommendation"]
    gb = {"resnet-18": 128, "resnet-50": 64, "transformer": 64, "lm": 40, "recommendation": 2048}
    specs = []
    for i in range(1000):
        w = wls[i % len(wls)]
        specs.append(dict(name=f"j{i:04d}", workload=w, global_batch=gb[w], epochs=1,
                          dataset_size=int(gb[w] * rng.integers(1_000, 50_000)),
                          weight=float(rng.choice([1, 2, 4]))))
    prob = PlanningProblem(parse_jobs(specs, "bench"), cluster(1000, per_node=8), TABLE)
    dt1, _ = first_placement(prob, "optimus-lb")
    res = {"single_placement_s": dt1}
    if not quick:
        dt, plan = timed_plan(prob, "optimus-lb")
        res["timeline_s"] = dt
        res["weighted_jct_s"] = plan.weighted_jct_s
    out["C"] = res


def scenario_d(out: dict, quick: bool) -> None:
    res = {}
    for trace, k, limit in (("small_test.trace", 15, None),
                            ("msr-seed0-0e4a51.trace", 30, 60 if quick else 120)):
        path = TRACES / trace
        if not path.exists():
            res[trace] = MISSING
            continue
        specs, _ = parse_trace(path, limit)
        prob = PlanningProblem(parse_jobs(specs, trace), cluster(k), TABLE)
        row = {}
        for name in ("auto", "fifo", "homo", "allox"):
            dt, plan = timed_plan(prob, name)
            row[name] = {"weighted_jct_s": plan.weighted_jct_s, "time_s": dt,
                         "chosen": plan.policy}
        a = row["auto"]["weighted_jct_s"]
        for name in ("fifo", "homo", "allox"):
            row[name]["auto_reduction"] = 1 - a / row[name]["weighted_jct_s"]  # type: ignore[index]
        res[f"{trace} on K={k} ({len(specs)} jobs)"] = row
    out["D"] = res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and smaller traces")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--only", default="ABCD", help="scenarios to run, e.g. AB")
    args = ap.parse_args()
    out: dict[str, object] = {"machine": f"{platform.node()} {platform.machine()} "
                              f"{platform.processor() or ''} python {platform.python_version()}"}
    for key, fn in (("A", scenario_a), ("B", scenario_b), ("C", scenario_c), ("D", scenario_d)):
        if key in args.only:
            t0 = time.perf_counter()
            fn(out, args.quick)
            print(f"scenario {key}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    text = json.dumps(out, indent=2, default=float)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
