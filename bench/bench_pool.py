"""Pool-mode benchmarks: the shape of Hare's evaluation (HPDC'22, section 7).

Run: python bench/bench_pool.py [--quick] [--out docs/bench_pool.json]; --bounds for the
default plan against the bound of task and space plans alike (each job alone, pooled speed,
the joint LP on pool rates)

Inputs: Gavel's measured throughputs (examples/gavel_throughputs.csv, made by
``hetsched convert gavel-throughputs``) and the first N jobs of Gavel's MSR
trace ``msr-seed0-0e4a51.trace`` (converted by hetsched.io.traces: per-job GPU
request = the trace's scale factor = Hare's tasks per round, real arrivals).
Gavel measured three GPU types, so "fast, middle, slow" = V100, P100, K80.

Scenarios
A. testbed-like: 15 GPUs (8 V100, 4 P100, 3 K80), 30 jobs.
B. 160 GPUs (V100:P100:K80 = 8:4:3), 100, 200 and 300 jobs.
C. 160 GPUs, 200 jobs, heterogeneity low (160 V100), middle (80 V100 + 80 K80),
   high (8:4:3 V100/P100/K80).
Each runs twice: with the trace's arrivals ("trace") and with every job
submitted at t=0 ("batch": the offline setting Hare's algorithm is built for).
D. Planning time of hare and of auto for 200 jobs on 160 GPUs.

Reported per scenario: total weighted JCT of every policy, Hare's reduction
against each baseline, the ratio of Hare to the lower bound next to the
paper's alpha(2+alpha), and planning times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
from gavel_data import TRACES  # noqa: E402

sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Node  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402
from hetsched.io.traces import parse_trace  # noqa: E402
from hetsched.planning.pool import POOL_AUTO, plan_pool  # noqa: E402
from hetsched.planning.pool.baselines import BASELINES  # noqa: E402
from hetsched.planning.pool.evaluator import evaluate  # noqa: E402
from hetsched.planning.pool.hare import hare_from  # noqa: E402
from hetsched.planning.pool.problem import PoolProblem  # noqa: E402
from hetsched.planning.pool.relaxation import alpha, relaxation  # noqa: E402

TABLE = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
TRACE = TRACES / "msr-seed0-0e4a51.trace"
BASELINE_NAMES = ("fifo", "srtf", "homo", "allox")


def cluster(mix: dict[str, int], per_node: int = 8) -> Cluster:
    nodes = []
    for t, k in mix.items():
        for j in range(0, k, per_node):
            nodes.append(Node(f"{t}-{j // per_node + 1}", t, min(per_node, k - j)))
    return Cluster(nodes=tuple(nodes), intra_node_gbps=300.0, inter_node_gbps=10.0)


def mix_8_4_3(k: int) -> dict[str, int]:
    v = round(k * 8 / 15)
    p = round(k * 4 / 15)
    return {"v100": v, "p100": p, "k80": k - v - p}


MIXES = {
    "low": {"v100": 160},
    "middle": {"v100": 80, "k80": 80},
    "high": mix_8_4_3(160),
}


def problem(n_jobs: int, mix: dict[str, int], load: str) -> PlanningProblem:
    raw, _ = parse_trace(TRACE, n_jobs)
    if load == "batch":
        for j in raw:
            j["arrival_s"] = 0.0
    return PlanningProblem(parse_jobs(raw, TRACE.name), cluster(mix), TABLE)


def run_scenario(name: str, n_jobs: int, mix: dict[str, int], load: str) -> dict[str, Any]:
    p = problem(n_jobs, mix, load)
    t0 = time.perf_counter()
    pp = PoolProblem(p)
    rel = relaxation(pp)
    res = hare_from(pp, rel)
    t_hare = time.perf_counter() - t0
    hare_v = evaluate(pp, res.schedule).objective
    out: dict[str, Any] = {"scenario": name, "jobs": n_jobs, "gpus": mix, "load": load,
                           "tasks": pp.n_tasks, "bound_method": rel.method,
                           "lower_bound": rel.value, "hare": hare_v,
                           "hare_variant": res.schedule.params,
                           "hare_variants": res.objectives,
                           "hare_planning_s": round(t_hare, 3),
                           "ratio_to_lb": hare_v / rel.value if rel.value > 0 else None,
                           "alpha": alpha(pp)}
    out["alpha_bound"] = out["alpha"] * (2 + out["alpha"])
    for b in BASELINE_NAMES:
        t1 = time.perf_counter()
        v = evaluate(pp, BASELINES[b](pp)).objective
        out[b] = v
        out[f"{b}_planning_s"] = round(time.perf_counter() - t1, 3)
        out[f"reduction_vs_{b}"] = 1.0 - hare_v / v
        # no schedule can cut more than this: the lower bound's own reduction
        out[f"max_possible_reduction_vs_{b}"] = 1.0 - rel.value / v
        out[f"{b}_over_hare"] = v / hare_v
    return out


def space_vs_pool(name: str, n_jobs: int, mix: dict[str, int], load: str) -> dict[str, Any]:
    """Pool mode against space mode on the same inputs, before and after pool plans
    contain space plans (bench/pool_vs_space.py; docs/pool.md)."""
    from pool_vs_space import compare

    return {"scenario": name, "load": load, **compare(problem(n_jobs, mix, load))}


def planning_time(n_jobs: int = 200, k: int = 160) -> dict[str, Any]:
    p = problem(n_jobs, mix_8_4_3(k), "trace")
    out: dict[str, Any] = {"jobs": n_jobs, "gpus": k}
    for pol in ("hare", "auto"):
        t0 = time.perf_counter()
        plan = plan_pool(p, pol)
        out[f"{pol}_s"] = round(time.perf_counter() - t0, 3)
        out[f"{pol}_json_mb"] = round(len(plan.to_json()) / 1e6, 2)
        out[f"{pol}_tasks"] = (plan.tasks.total_tasks or 0) if plan.tasks else 0
        out[f"{pol}_stored_rows"] = (plan.tasks.stored_rows or 0) if plan.tasks else 0
    return out


def fmt_row(r: dict[str, Any]) -> str:
    red = " ".join(f"{100 * r[f'reduction_vs_{b}']:5.1f}% ({100 * r[f'max_possible_reduction_vs_{b}']:.0f}%)"
                   for b in BASELINE_NAMES)
    return (f"| {r['scenario']:<18} | {r['load']:<5} | {r['tasks']:>7} | {r['hare']:.4g} | "
            f"{red} | {r['ratio_to_lb']:.3f} | {r['alpha_bound']:.1f} | {r['hare_planning_s']:.2f} |")


def bound_rows() -> None:
    """Each scenario's default plan against pool mode's bound of task and space plans:
    each job alone, the pooled speed, the joint LP on pool rates (up to 200 jobs, with its
    process CPU seconds), and the gap with alone only, with the first two (before the LP)
    and with all three."""
    from hetsched.planning.pool.union_bound import union_bound

    scen = [("A testbed 15", 30, mix_8_4_3(15))] + [
        (f"B 160 GPUs {n} jobs", n, mix_8_4_3(160)) for n in (100, 200, 300)] + [
        (f"C hetero {h}", 200, MIXES[h]) for h in ("low", "middle")]
    print("| scenario | load | pool plan (s) | each job alone | pooled speed | joint LP (CPU) | "
          "gap, alone only | gap, alone and pooled | gap, all three |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, mix in scen:
        for load in ("trace", "batch"):
            p = problem(n, mix, load)
            w = plan_pool(p, "hare").weighted_jct_s
            c0 = time.process_time()
            v, parts = union_bound(p, PoolProblem(p))
            cpu = time.process_time() - c0
            two = max(parts["alone"], parts["pooled"])
            lp = f"{parts['lp']:,.0f} ({cpu:.1f} s)" if "lp" in parts else f"- ({cpu:.1f} s)"
            print(f"| {name} | {load} | {w:,.0f} | {parts['alone']:,.0f} | "
                  f"{parts['pooled']:,.0f} | {lp} | {(w - parts['alone']) / w:.1%} | "
                  f"{(w - two) / w:.1%} | {(w - v) / w:.1%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only scenarios A and B(200)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_pool.json"))
    ap.add_argument("--space", action="store_true",
                    help="only pool against space mode, before and after pool plans contain "
                         "space plans (scenarios A and B(100), both loads)")
    ap.add_argument("--bounds", action="store_true",
                    help="only the default plan against pool mode's bound of task and space "
                         "plans (each job alone, the pooled speed, the joint LP on pool "
                         "rates), every scenario")
    args = ap.parse_args()
    if args.bounds:
        bound_rows()
        return
    if args.space:
        from pool_vs_space import HEADER, row

        rows_s = []
        print(HEADER)
        for name, n, mix in (("A testbed 15", 30, mix_8_4_3(15)),
                             ("B 160 GPUs 100 jobs", 100, mix_8_4_3(160))):
            for load in ("trace", "batch"):
                r = space_vs_pool(name, n, mix, load)
                rows_s.append(r)
                print(row(f"{name}, {load}", r), flush=True)
        meta = {"machine": platform.platform(), "cpus": os.cpu_count(),
                "command": " ".join(["python", *sys.argv]), "load": os.getloadavg()}
        Path(args.out).write_text(json.dumps({"meta": meta, "space_vs_pool": rows_s},
                                             indent=1) + "\n", encoding="utf-8")
        return
    scen: list[tuple[str, int, dict[str, int]]] = [("A testbed 15", 30, mix_8_4_3(15))]
    sizes = (200,) if args.quick else (100, 200, 300)
    scen += [(f"B 160 GPUs {n} jobs", n, mix_8_4_3(160)) for n in sizes]
    if not args.quick:
        scen += [(f"C hetero {h}", 200, MIXES[h]) for h in ("low", "middle")]
    rows = []
    print("| scenario | load | tasks | Hare wJCT (s) | reduction vs fifo srtf homo allox "
          "(at most possible) |"
          " Hare/LB | a(2+a) | Hare plan s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, mix in scen:
        for load in ("trace", "batch"):
            r = run_scenario(name, n, mix, load)
            rows.append(r)
            print(fmt_row(r), flush=True)
    timing = planning_time()
    print(f"\nplanning time, 200 jobs on 160 GPUs: hare {timing['hare_s']} s, "
          f"auto (all {len(POOL_AUTO)} policies) {timing['auto_s']} s; "
          f"{timing['hare_tasks']} tasks stored as {timing['hare_stored_rows']} rows, "
          f"plan JSON {timing['hare_json_mb']} MB")
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "command": " ".join(["python", *sys.argv])}
    Path(args.out).write_text(json.dumps({"meta": meta, "scenarios": rows, "timing": timing},
                                         indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
