"""Lower-bound benchmark: gap of each bound to the best known plan.

Run: python bench/bench_bounds.py [--n 40] [--seed 0] [--out docs/bench_bounds.json]

Random small instances (2-6 jobs, 4-16 GPUs over 2-4 GPU types, Gavel's
measured throughputs, arrivals, weights, model sizes). For each, the best
known plan is the best of ``exhaustive`` (per-event exact), static
``exhaustive`` (one exact placement per arrival) and ``auto``; the true optimum
is at most that, so the gaps below are upper estimates of the true gaps. Then
``gap = (best - bound) / best`` for the old bound (max of alone and priced
capacity) and the new one (max with the joint LP), and the LP's solve time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Job, Node  # noqa: E402
from hetsched.core.throughput import ProfileRow, ThroughputTable  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.planning.bounds import lower_bound_info  # noqa: E402
from hetsched.planning.planner import plan_problem  # noqa: E402

GAVEL = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
MODEL_MB = {"resnet-18": 45.0, "resnet-50": 98.0, "transformer": 250.0, "lm": 120.0,
            "recommendation": 160.0}
#: a fourth type for 4-type instances: an A100-like GPU, 2.5x a V100 (same shape)
EXTRA = "a100"


def table_with_extra() -> ThroughputTable:
    rows = list(GAVEL.all_rows())
    rows += [ProfileRow(r.workload, EXTRA, r.local_batch, r.step_time_s / 2.5, gpus=r.gpus)
             for r in GAVEL.all_rows() if r.gpu_type == "v100" and r.colocated_with is None]
    return ThroughputTable(rows, "gavel+a100")


TABLE = table_with_extra()


def instance(rng: np.random.Generator, max_jobs: int = 6, max_gpus: int = 16,
             arrivals: bool = True) -> PlanningProblem:
    T = int(rng.integers(2, 5))
    types = list(rng.choice(["v100", "p100", "k80", EXTRA], size=T, replace=False))
    total = int(rng.integers(max(T, 4), max_gpus + 1))
    counts = np.ones(T, dtype=int) + rng.multinomial(total - T, np.ones(T) / T)
    nodes = []
    for t, n in zip(types, counts, strict=True):
        k = 0
        while n > 0:
            size = int(min(n, 4))
            nodes.append(Node(f"{t}-{k}", str(t), size))
            n -= size
            k += 1
    cluster = Cluster(nodes=tuple(nodes), intra_node_gbps=300.0, inter_node_gbps=10.0)
    S = int(rng.integers(2, max_jobs + 1))
    jobs = []
    for s in range(S):
        wl = str(rng.choice(GAVEL.workloads))
        cap = min(GAVEL.get(wl, str(t)).max_batch for t in types
                  if GAVEL.get(wl, str(t)) is not None)
        gb = int(cap * int(rng.choice([1, 2, 4])))
        iters = int(rng.integers(200, 5000))
        jobs.append(Job(name=f"j{s}", workload=wl, dataset_size=gb * iters, epochs=1,
                        global_batch=gb, weight=float(rng.choice([1.0, 1.0, 2.0, 0.5])),
                        arrival_s=float(rng.choice([0.0, 0.0, 0.0, 60.0, 300.0, 1200.0]))
                        if arrivals else 0.0,
                        model_size_mb=MODEL_MB.get(wl, 0.0)))
    return PlanningProblem(jobs, cluster, TABLE)


def best_plan(p: PlanningProblem) -> tuple[float, str]:
    best, who = float("inf"), ""
    for label, pol, static in (("exhaustive", "exhaustive", False),
                               ("exhaustive static", "exhaustive", True),
                               ("auto", "auto", False)):
        try:
            v = plan_problem(p, pol, static=static, restart_cost_s=0.0).weighted_jct_s
        except Exception:  # noqa: BLE001 - a policy refusing (size limit) just drops out
            continue
        if v < best:
            best, who = v, label
    return best, who


#: the offline planners tried besides ``auto`` on the trace instances (not the product's:
#: more samples, other seeds), to see how far the best plan drops: (label, policy, params)
STRONGER = (("exhaustive", "exhaustive", None), ("has refill", "has", {"refill": True}),
            ("jps 256 seed 1", "jps", {"samples": 256, "seed": 1}),
            ("jps 256 seed 2", "jps", {"samples": 256, "seed": 2}))
#: a larger LP than the product's (columns, rounds, configurations per job, intervals):
#: how far the bound rises with ~10x its CPU
CEILING = {"MAX_VARS": 200_000, "VARS_PER_JOB": 10_000, "MIN_VARS": 200_000, "MAX_ROUNDS": 8,
           "GRID_TARGET": 2, "INTERVALS": 400, "ITERATION_LIMIT": 10_000_000}
#: the product's LP with every Pareto configuration of every job, none merged (columns
#: without a cap): how much of the gap the merging holds (minutes of CPU at 175 jobs)
UNMERGED = {"MAX_VARS": 10**8, "VARS_PER_JOB": 10**8, "MIN_VARS": 10**8, "MAX_CONFIGS": 10**6,
            "GRID_TARGET": 1,
            "INTERVALS": 192, "ITERATION_LIMIT": 10**8, "TIME_LIMIT_S": 3600.0}


def trace_problems() -> list[tuple[str, PlanningProblem]]:
    """Gavel's traces with free sizes on 12 V100 + 12 P100 + 12 K80 (the Gavel replay's)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_gavel_replay import GAVEL, TABLE, cluster

    from hetsched.io.specs import parse_jobs
    from hetsched.io.traces import parse_trace

    out = []
    for name, limit in (("medium_test.trace", 1000), ("msr-seed0-0e4a51.trace", 50),
                        ("msr-seed0-0e4a51.trace", 100), ("msr-seed0-2869ce.trace", 200)):
        specs, _ = parse_trace(GAVEL / "traces" / name, limit)
        jobs = parse_jobs([{**s, "requested_gpus": None} for s in specs
                           if s["requested_gpus"] <= 12], name)
        out.append((name, PlanningProblem(jobs, cluster(), TABLE)))
    return out


def ceiling_bound(p: PlanningProblem, sizes: dict[str, float] = CEILING
                  ) -> tuple[float | None, float]:
    """The joint LP with ``sizes`` (``CEILING``, ``UNMERGED``; offline), and its CPU
    seconds; None when its first solve ends at the iteration limit."""
    from hetsched.planning import bounds, lp_bound
    from hetsched.planning.pooled_bound import pooled_bound

    saved = {k: getattr(lp_bound, k) for k in sizes}
    c0 = time.process_time()
    try:
        for k, v in sizes.items():
            setattr(lp_bound, k, v)
        sb = bounds._simple_bounds(p)
        _, comp = pooled_bound(p.weight, p.arrival, sb.P, sb.E_pool, p.n_type.astype(float),
                               sb.pool_prices)
        lp = lp_bound.lp_lower_bound(p, sb.lattices, n_intervals=int(sizes["INTERVALS"]),
                                     confs=sb.confs, hint=comp)
    finally:
        for k, v in saved.items():
            setattr(lp_bound, k, v)
    return (float(lp["weighted_jct_s"]) if lp else None), time.process_time() - c0


def traces(stronger: bool, ceiling: bool, unmerged: bool = False) -> list[dict[str, object]]:
    """Larger instances: the bound of each kind, its CPU time and the gap to the best plan
    (auto's, or with ``stronger`` the best of auto and ``STRONGER``; restart cost 0)."""
    import os

    out = []
    for name, p in trace_problems():
        c0 = time.process_time()
        info = lower_bound_info(p)
        cpu = time.process_time() - c0
        plans: dict[str, dict[str, Any]] = {}
        for label, pol, params in (("auto", "auto", None),) + (STRONGER if stronger else ()):
            c1 = time.process_time()
            plan = plan_problem(p, pol, params, restart_cost_s=0.0)
            plans[label] = {"value": plan.weighted_jct_s, "policy": plan.policy,
                            "cpu_s": round(time.process_time() - c1, 1)}
        who = min(plans, key=lambda k: plans[k]["value"])
        best = float(plans[who]["value"])
        row = {"trace": name, "jobs": p.S, "gpus": p.K, "kind": info["kind"],
               "bounds": info["bounds"], "bound_cpu_s": round(cpu, 2), "plans": plans,
               "best": best, "best_by": who, "gap": (best - info["weighted_jct_s"]) / best,
               "auto_above_best": plans["auto"]["value"] / best - 1,
               "load": os.getloadavg()[0]}
        if ceiling:
            v, c = ceiling_bound(p)
            row.update(ceiling_bound=v, ceiling_cpu_s=round(c, 1),
                       ceiling_gap=None if v is None else (best - v) / best)
        if unmerged:
            v, c = ceiling_bound(p, UNMERGED)
            row.update(unmerged_bound=v, unmerged_cpu_s=round(c, 1),
                       unmerged_gap=None if v is None else (best - v) / best)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def sweep_problems() -> list[tuple[str, PlanningProblem]]:
    """Sweeps: 30 single-GPU jobs at once on 4 V100 + 4 P100 + 8 K80 (Gavel's
    throughputs). Many jobs that look alike make the LP degenerate."""
    nodes = (Node("v100-1", "v100", 4), Node("p100-1", "p100", 4), Node("k80-1", "k80", 4),
             Node("k80-2", "k80", 4))
    cl = Cluster(nodes=nodes, intra_node_gbps=300.0, inter_node_gbps=10.0)

    def job(i: int, wl: str, size: int, batch: int) -> Job:
        return Job(name=f"s{i:02d}", workload=wl, dataset_size=size, epochs=1,
                   global_batch=batch, max_gpus=1, model_size_mb=MODEL_MB[wl])

    mix = (("resnet-18", 128), ("transformer", 64), ("lm", 40))
    return [("30 identical (resnet-18)", PlanningProblem(
                [job(i, "resnet-18", 50_000, 128) for i in range(30)], cl, GAVEL)),
            ("30 sizes (resnet-18, +2% each)", PlanningProblem(
                [job(i, "resnet-18", int(50_000 * 1.02 ** i), 128) for i in range(30)], cl,
                GAVEL)),
            ("30 of 3 workloads", PlanningProblem(
                [job(i, mix[i % 3][0], 50_000, mix[i % 3][1]) for i in range(30)], cl,
                GAVEL))]


def sweeps() -> list[dict[str, object]]:
    """The bound on the sweeps: its kind, CPU seconds and gap to auto's plan; how each
    LP solve went (simplex or interior point iterations)."""
    import highspy

    solves: list[dict[str, object]] = []
    run = highspy.Highs.run

    def counted(h: Any) -> Any:
        c0 = time.process_time()
        r = run(h)
        info = h.getInfo()
        solves.append({"cpu_s": round(time.process_time() - c0, 2),
                       "simplex": int(info.simplex_iteration_count),
                       "ipm": int(info.ipm_iteration_count),
                       "status": h.modelStatusToString(h.getModelStatus())})
        return r

    highspy.Highs.run = counted
    out = []
    try:
        for name, p in sweep_problems():
            solves.clear()
            c0 = time.process_time()
            info = lower_bound_info(p)
            cpu = time.process_time() - c0
            plan = plan_problem(p, "auto", restart_cost_s=0.0)
            row = {"instance": name, "jobs": p.S, "kind": info["kind"],
                   "bound": info["weighted_jct_s"], "bound_cpu_s": round(cpu, 2),
                   "auto": plan.weighted_jct_s, "auto_policy": plan.policy,
                   "gap": (plan.weighted_jct_s - info["weighted_jct_s"]) / plan.weighted_jct_s,
                   "solves": list(solves)}
            print(json.dumps(row), flush=True)
            out.append(row)
    finally:
        highspy.Highs.run = run
    return out


def by_job() -> list[dict[str, object]]:
    """Where the LP bound's gap is, per trace instance: each job's weighted time in the
    system in the plan of ``exhaustive`` and at the LP's optimum, the jobs that hold most
    of the difference, and how much of it is in jobs the LP lets finish within 10% of
    their time alone (it sees no wait for them, the plan does)."""
    from hetsched.planning import bounds, lp_bound
    from hetsched.planning.pooled_bound import pooled_bound

    out = []
    for name, p in trace_problems():
        sb = bounds._simple_bounds(p)
        _, comp = pooled_bound(p.weight, p.arrival, sb.P, sb.E_pool, p.n_type.astype(float),
                               sb.pool_prices)
        lp = lp_bound.lp_lower_bound(p, sb.lattices, confs=sb.confs, hint=comp)
        if lp is None:
            continue
        plan = plan_problem(p, "exhaustive", restart_cost_s=0.0)
        a, w = p.arrival.astype(float), p.weight.astype(float)
        in_plan = w * (np.array([jp.end_s for jp in plan.jobs]) - a)
        in_lp = w * (np.array(lp["completion_s"]) - a)
        diff = in_plan - in_lp
        order = np.argsort(-diff, kind="stable")
        quick = np.array(lp["completion_s"]) - a <= 1.1 * sb.P  # the LP sees no wait
        top = order[:10]
        # the no-wait jobs in the plan: their wait, and their GPU sets' speed (model)
        slower, model_ratio, wait = [], [], []
        for i, jp in enumerate(plan.jobs):
            if not quick[i]:
                continue
            wait.append(jp.segments[0].start_s - a[i])
            for s in jp.segments:
                x = np.zeros((1, p.T), dtype=int)
                for wk in s.workers:
                    x[0, p.types.index(wk.gpu_type)] += 1
                m = float(p.iter_time(i, x)[0])
                model_ratio.append(s.iteration_s / m)
                slower.append(m * float(p.iters[i]) / float(sb.P[i]))
        segs = [s for jp in plan.jobs for s in jp.segments]
        t0, t1 = min(s.start_s for s in segs), max(s.end_s for s in segs)
        busy = sum(len(s.workers) * (s.end_s - s.start_s) for s in segs) / (p.K * (t1 - t0))
        row = {"trace": name, "jobs": p.S, "plan": float(in_plan.sum()), "lp": float(in_lp.sum()),
               "gap": float(diff.sum() / in_plan.sum()),
               "top10_share": float(diff[top].sum() / diff.sum()),
               "lp_no_wait_jobs": int(quick.sum()),
               "lp_no_wait_share": float(diff[quick].sum() / diff.sum()),
               "no_wait_jobs_in_plan": {
                   "median_wait_s": float(np.median(wait)) if wait else None,
                   "median_plan_over_model_iter": float(np.median(model_ratio))
                   if model_ratio else None,
                   "median_slower_than_fastest": float(np.median(slower)) if slower else None,
                   "p90_slower_than_fastest": float(np.quantile(slower, 0.9))
                   if slower else None},
               "plan_gpu_busy": float(busy),
               "top": [{"job": int(i), "arrival_s": round(float(a[i])),
                        "alone_s": round(float(sb.P[i])),
                        "lp_s": round(float(in_lp[i] / w[i])),
                        "plan_s": round(float(in_plan[i] / w[i]))}
                       for i in top]}
        print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=40, help="random instances")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", action="store_true", help="every job arrives at t = 0")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_bounds.json"))
    ap.add_argument("--traces", action="store_true",
                    help="only the larger Gavel-trace instances (19-200 jobs)")
    ap.add_argument("--stronger", action="store_true",
                    help="with --traces: also the offline planners of STRONGER (minutes)")
    ap.add_argument("--ceiling", action="store_true",
                    help="with --traces: also the larger LP of CEILING (~10x the CPU)")
    ap.add_argument("--unmerged", action="store_true",
                    help="with --traces: also the LP with no configuration merged (UNMERGED; "
                    "minutes of CPU)")
    ap.add_argument("--sweeps", action="store_true",
                    help="the bound on sweeps of 30 single-GPU jobs (degenerate LPs)")
    ap.add_argument("--by-job", action="store_true",
                    help="where the LP's gap is on the trace instances, job by job")
    args = ap.parse_args()
    if args.sweeps:
        Path(args.out).write_text(json.dumps({"machine": platform.platform(),
                                              "command": " ".join(["python", *sys.argv]),
                                              "rows": sweeps()}, indent=2) + "\n")
        return
    if args.by_job:
        Path(args.out).write_text(json.dumps({"machine": platform.platform(),
                                              "command": " ".join(["python", *sys.argv]),
                                              "rows": by_job()}, indent=2) + "\n")
        return
    if args.traces:
        rows_t = traces(args.stronger, args.ceiling, args.unmerged)
        Path(args.out).write_text(json.dumps({"machine": platform.platform(),
                                              "command": " ".join(["python", *sys.argv]),
                                              "rows": rows_t}, indent=2) + "\n")
        return
    rng = np.random.default_rng(args.seed)
    rows = []
    for k in range(args.n):
        p = instance(rng, arrivals=not args.batch)
        t0 = time.process_time()  # CPU seconds: the same on a busy machine
        info = lower_bound_info(p)
        t_lb = time.process_time() - t0
        best, who = best_plan(p)
        old = max(info["bounds"]["alone"], info["bounds"]["fluid"])
        new = info["weighted_jct_s"]
        rows.append({"jobs": p.S, "gpus": int(p.K), "types": p.T, "best": best, "best_by": who,
                     "old_bound": old, "new_bound": new, "kind": info["kind"],
                     "old_gap": (best - old) / best, "new_gap": (best - new) / best,
                     "bound_cpu_s": t_lb})
        r = rows[-1]
        print(f"{k:3d} S={p.S} K={p.K} T={p.T} best={best:12.1f} ({who:17s}) "
              f"old gap {r['old_gap']:6.1%} new gap {r['new_gap']:6.1%} [{r['kind']}] "
              f"{t_lb:.2f} s", file=sys.stderr)
    invalid = [r for r in rows if r["new_bound"] > r["best"] * (1 + 1e-9)]
    summary = {
        "instances": len(rows),
        "median_old_gap": statistics.median(r["old_gap"] for r in rows),
        "median_new_gap": statistics.median(r["new_gap"] for r in rows),
        "p90_new_gap": float(np.quantile([r["new_gap"] for r in rows], 0.9)),
        "max_new_gap": max(r["new_gap"] for r in rows),
        "lp_active": sum(r["kind"] == "lp" for r in rows),
        "median_bound_cpu_s": statistics.median(r["bound_cpu_s"] for r in rows),
        "max_bound_cpu_s": max(r["bound_cpu_s"] for r in rows),
        "bound_above_best_plan": len(invalid),
    }
    out = {"machine": platform.platform(), "python": platform.python_version(),
           "seed": args.seed, "arrivals": not args.batch, "summary": summary, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
