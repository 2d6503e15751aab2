"""Fused passes: pool mode with and without them, on the same space plan.

Run: python bench/bench_fused.py [--out docs/bench_fused.json] [--quick]

A pool task sums its steps' gradients for its round's one optimizer step, so
several steps' slices may share one forward and backward pass (docs/pool.md,
"Fused passes"). For each instance, space mode's ``auto`` plans once; pool
mode's default (``hare``, seeded by that space plan) then plans twice on it:
``fuse=False`` (one step's slice a pass: the model before fused passes) and the
default (fused passes). Ratios are to the space plan's weighted JCT; the idle
shares are the space plan's (all GPU time idle, and idle while a job waits:
bench/pool_vs_space.py). Planning times are wall seconds of ``plan_pool``
given the space plan. Every plan is deterministic (counted budgets), so the
ratios do not depend on the machine's load; the times do.

Instances: bench_pool's A (30 jobs of Gavel's 0e4a51 trace on 15 GPUs, 8 V100,
4 P100, 3 K80) with arrivals and all at 0, and B (100 jobs on 160 GPUs, the
same mix); Gavel's small_test and medium_test with free sizes on 12 V100 + 12
P100 + 12 K80 (the Gavel replay's cluster), and artifact_evaluation and
small_test and the first 50 jobs of the three MSR traces (those a 12-GPU type
can hold) with each job pinned to its trace's GPU count (the replay's
``--pool --pinned``); the bundled example.
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
sys.path.insert(0, str(ROOT / "bench"))

from bench_gavel_replay import GAVEL, TABLE, cluster, trace_jobs  # noqa: E402
from bench_pool import mix_8_4_3, problem  # noqa: E402
from pool_vs_space import idle_share, idle_while_waiting  # noqa: E402

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402
from hetsched.io.traces import parse_trace  # noqa: E402
from hetsched.planning.planner import plan_problem  # noqa: E402
from hetsched.planning.pool import plan_pool  # noqa: E402


def gavel(name: str) -> PlanningProblem:
    specs, _ = parse_trace(GAVEL / "traces" / name, 1000)
    jobs = parse_jobs([{**s, "requested_gpus": None} for s in specs
                       if s["requested_gpus"] <= 12], name)
    return PlanningProblem(jobs, cluster(), TABLE)


def pinned(name: str) -> PlanningProblem:
    """Gavel's own setting: each job on exactly its trace's GPU count (the replay's
    ``--pool --pinned``)."""
    return PlanningProblem(trace_jobs(name, 50, pinned=True), cluster(), TABLE)


def example() -> PlanningProblem:
    from hetsched.io.profiles import load_throughputs
    from hetsched.io.specs import load_cluster, load_jobs

    ex = ROOT / "examples"
    return PlanningProblem(load_jobs(ex / "jobs.yaml"), load_cluster(ex / "cluster.yaml"),
                           load_throughputs(ex / "gavel_throughputs.csv"))


def row(name: str, p: PlanningProblem) -> dict[str, Any]:
    space = plan_problem(p, "auto")
    out: dict[str, Any] = {"instance": name, "jobs": p.S, "gpus": p.K,
                           "space": space.weighted_jct_s, "space_policy": space.policy,
                           "idle": idle_share(space, p.K),
                           "idle_waiting": idle_while_waiting(space, p.K)}
    for tag, fuse in (("unfused", False), ("fused", True)):
        t0 = time.perf_counter()
        plan = plan_pool(p, "hare", space_plan=space, fuse=fuse)
        out[f"{tag}_s"] = round(time.perf_counter() - t0, 2)
        out[tag] = plan.weighted_jct_s
        out[f"{tag}_over_space"] = plan.weighted_jct_s / space.weighted_jct_s
        out[f"{tag}_order"] = plan.params.get("order")
        out[f"{tag}_bound_over_space"] = plan.lower_bound_s / space.weighted_jct_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_fused.json"))
    ap.add_argument("--quick", action="store_true", help="A and the bundled example only")
    args = ap.parse_args()
    cases: list[tuple[str, Any]] = [
        ("example", example), ("A, trace", lambda: problem(30, mix_8_4_3(15), "trace")),
        ("A, batch", lambda: problem(30, mix_8_4_3(15), "batch"))]
    if not args.quick:
        cases += [("B 100 jobs, trace", lambda: problem(100, mix_8_4_3(160), "trace")),
                  ("B 100 jobs, batch", lambda: problem(100, mix_8_4_3(160), "batch")),
                  ("Gavel small_test (19)", lambda: gavel("small_test.trace")),
                  ("Gavel medium_test (19)", lambda: gavel("medium_test.trace")),
                  ("pinned: artifact_evaluation", lambda: pinned("artifact_evaluation.trace")),
                  ("pinned: small_test", lambda: pinned("small_test.trace"))]
        cases += [(f"pinned: {t} (first 50)", lambda t=t: pinned(f"{t}.trace"))
                  for t in ("msr-seed0-2869ce", "msr-seed0-ee9e8c", "msr-seed0-0e4a51")]
    print("| instance | idle GPU share (while a job waits) | one slice a pass / space | "
          "**fused / space** | fused's start | bound / space (fused) | pool part (s) |")
    print("|---|---:|---:|---:|---|---:|---:|")
    rows = []
    for name, make in cases:
        r = row(name, make())
        rows.append(r)
        print(f"| {name} | {r['idle']:.1%} ({r['idle_waiting']:.2%}) | "
              f"{r['unfused_over_space']:.4f} | **{r['fused_over_space']:.4f}** | "
              f"{r['fused_order']} | {r['fused_bound_over_space']:.3f} | "
              f"{r['unfused_s']} -> {r['fused_s']} |", flush=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(),
            "command": " ".join(["python", *sys.argv]), "load": os.getloadavg()}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n",
                              encoding="utf-8")


if __name__ == "__main__":
    main()
