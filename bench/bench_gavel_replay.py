"""Replay Gavel's traces: Gavel's own constraints first, then hetsched's freedoms.

Run: python bench/bench_gavel_replay.py [--jobs 120] [--out docs/bench_gavel_replay.json]

Inputs: Gavel's traces (bench/gavel_data.py says where, converted by
``hetsched.io.traces``: a job of scale factor s runs steps / s iterations of
s x batch samples) and Gavel's measured throughputs
(``simulation_throughputs.json``: the isolated rate of every model at scale
1/2/4/8 on K80/P100/V100). Cluster: 12 V100 + 12 P100 + 12 K80 in servers of
4 (Gavel's simulated cluster shape, scaled down), 300 Gbit/s inside a server.
Subsampled to the first ``--jobs`` jobs of each trace to keep the run short.

1. *Pinned, like Gavel* (this script's own event simulator, no hetsched
   model): every job runs on exactly its trace's scale factor s, on GPUs of
   one type, never resized or moved, restart cost 0, its iteration time read
   straight from Gavel's table (``s / rate(type, s)``). Policies as Gavel's
   baselines name them: ``fifo`` (arrival order, the first type with s free
   GPUs in a fixed order: heterogeneity-agnostic), ``fifo_perf`` (arrival
   order, the job's fastest type with s free GPUs), ``srtf_perf`` (shortest
   remaining work first on its fastest free type; non-preemptive).
2. *hetsched, sizes pinned* (``requested_gpus = min_gpus = max_gpus = s``):
   hetsched's own policies under the same sizes, restart cost 0; mixing GPU
   types within a job and uneven batches are allowed.
3. *hetsched, free*: the same jobs without size pins (sizing, mixing, uneven
   batches), ``auto``, restart cost 0.

``--pool``: instead, pool mode against space mode on the free jobs (restart cost
0) of medium_test, small_test and the MSR trace, before and after pool plans
contain space plans (bench/pool_vs_space.py). ``--pool --pinned``: the same on
every trace with each job on exactly its scale factor's GPU count, Gavel's own
setting, where a space plan leaves GPUs idle while a wide job waits for its
GPUs and time sharing can use them. ``--denser K`` divides every arrival time by
K, so more jobs queue at once.

hetsched predicts with its calibrated model (one-GPU step time plus the sync
time calibrated from the 2/4/8-GPU rows; docs/model.md), the pinned replay with
Gavel's raw numbers, so the columns compare policies on (nearly) the same
performance data, not hetsched's model against Gavel's simulator, which is not
run here.
"""

from __future__ import annotations

import argparse
import ast
import heapq
import json
import os
import platform
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from gavel_data import GAVEL, MISSING  # noqa: E402

sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Job, Node  # noqa: E402
from hetsched.io.profiles import load_throughputs, workload_key  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402
from hetsched.io.traces import parse_trace  # noqa: E402
from hetsched.planning.planner import plan_problem  # noqa: E402

TRACES = ("artifact_evaluation.trace", "small_test.trace", "medium_test.trace",
          "msr-seed0-2869ce.trace", "msr-seed0-ee9e8c.trace", "msr-seed0-0e4a51.trace")
TYPES = ("v100", "p100", "k80")  # the fixed order heterogeneity-agnostic FIFO takes
PER_TYPE = 12
TABLE = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")


def gavel_iteration_times() -> dict[tuple[str, int, str, int], float]:
    """(workload, batch, type, scale) -> seconds per synchronous iteration, from Gavel's table."""
    raw = json.loads((GAVEL / "simulation_throughputs.json").read_text())
    out = {}
    for t in TYPES:
        for key, entry in raw[t].items():
            name, s = ast.literal_eval(key)
            m = re.match(r"^(.+?) \(batch size (\d+)\)$", name)
            if m and isinstance(entry, dict) and entry.get("null"):
                out[(workload_key(m[1]), int(m[2]), t, int(s))] = s / float(entry["null"])
    return out


def pinned_replay(jobs: list[Job], policy: str, it: dict[tuple[str, int, str, int], float]) -> float:
    """Weighted JCT of the pinned event simulation (module docstring, item 1)."""
    free = {t: PER_TYPE for t in TYPES}
    waiting: list[int] = []
    running: list[tuple[float, int, str]] = []  # (end, job, type)
    arrivals = sorted(range(len(jobs)), key=lambda i: jobs[i].arrival_s)
    ai, now, done = 0, 0.0, {}

    def itime(i: int, t: str) -> float:
        j = jobs[i]
        s = int(j.requested_gpus or 1)
        return it.get((j.workload, j.global_batch // s, t, s), float("inf"))

    def types_for(i: int) -> list[str]:
        if policy == "fifo":
            return list(TYPES)
        return sorted(TYPES, key=lambda t: itime(i, t))

    def work(i: int) -> float:
        return jobs[i].iterations * min(itime(i, t) for t in TYPES)

    while len(done) < len(jobs):
        while ai < len(arrivals) and jobs[arrivals[ai]].arrival_s <= now + 1e-9:
            waiting.append(arrivals[ai])
            ai += 1
        order = sorted(waiting, key=work) if policy == "srtf_perf" else waiting
        for i in list(order):
            s = int(jobs[i].requested_gpus or 1)
            for t in types_for(i):
                if free[t] >= s and itime(i, t) < float("inf"):
                    free[t] -= s
                    heapq.heappush(running, (now + jobs[i].iterations * itime(i, t), i, t))
                    waiting.remove(i)
                    break
            else:
                if policy != "srtf_perf":
                    break  # FIFO: the head of the queue blocks the rest
        nxt = [running[0][0]] if running else []
        if ai < len(arrivals):
            nxt.append(jobs[arrivals[ai]].arrival_s)
        now = min(nxt)
        while running and running[0][0] <= now + 1e-9:
            end, i, t = heapq.heappop(running)
            free[t] += int(jobs[i].requested_gpus or 1)
            done[i] = end
    return sum(jobs[i].weight * (done[i] - jobs[i].arrival_s) for i in done)


def cluster() -> Cluster:
    nodes = [Node(f"{t}-{k}", t, 4) for t in TYPES for k in range(PER_TYPE // 4)]
    return Cluster(nodes=tuple(nodes), intra_node_gbps=300.0, inter_node_gbps=10.0)


def run_trace(name: str, limit: int) -> dict[str, object]:
    it = gavel_iteration_times()
    # a job Gavel never measured at its scale on any type (or wider than a type) cannot be replayed
    n_all = len(parse_trace(GAVEL / "traces" / name, limit)[0])
    pinned = trace_jobs(name, limit, pinned=True)
    free = [replace(j, requested_gpus=None, min_gpus=1, max_gpus=None) for j in pinned]
    row: dict[str, object] = {"jobs": len(pinned), "dropped_unmeasured": n_all - len(pinned),
                              "gpus": 3 * PER_TYPE}
    for pol in ("fifo", "fifo_perf", "srtf_perf"):
        row[f"gavel-like {pol}"] = pinned_replay(pinned, pol, it)
    for label, jobs, pols in (("hetsched pinned", pinned, ("fifo", "srtf", "allox", "auto")),
                              ("hetsched free", free, ("auto",))):
        prob = PlanningProblem(jobs, cluster(), TABLE)
        for pol in pols:
            t0 = time.perf_counter()
            plan = plan_problem(prob, pol, restart_cost_s=0.0)
            row[f"{label} {pol}"] = plan.weighted_jct_s
            row[f"{label} {pol} time_s"] = time.perf_counter() - t0
            if pol == "auto":
                row[f"{label} auto chosen"] = plan.policy
    return row


def trace_jobs(name: str, limit: int, pinned: bool = False) -> list[Job]:
    """The trace's first ``limit`` jobs Gavel measured: each on exactly its scale
    factor's GPU count (``pinned``, Gavel's own setting) or without size pins."""
    it = gavel_iteration_times()
    specs, _ = parse_trace(GAVEL / "traces" / name, limit)
    specs = [s for s in specs if s["requested_gpus"] <= PER_TYPE and any(
        (s["workload"], s["global_batch"] // s["requested_gpus"], t, s["requested_gpus"]) in it
        for t in TYPES)]
    jobs = parse_jobs([{**s, "min_gpus": s["requested_gpus"], "max_gpus": s["requested_gpus"]}
                       for s in specs], name)
    if pinned:
        return jobs
    return [replace(j, requested_gpus=None, min_gpus=1, max_gpus=None) for j in jobs]


def pool_vs_space(limit: int, out: str, pinned: bool = False, denser: float = 1.0) -> None:
    """Pool mode against space mode, before and after (the module docstring's --pool);
    ``denser``: every arrival time divided by it (more jobs queue at once)."""
    from pool_vs_space import HEADER, compare, row

    res: dict[str, object] = {}
    print(HEADER)
    names = TRACES if pinned else ("medium_test.trace", "small_test.trace",
                                   "msr-seed0-0e4a51.trace")
    for name in names:
        if not (GAVEL / "traces" / name).is_file():
            res[name] = MISSING
            continue
        jobs = [replace(j, arrival_s=j.arrival_s / denser)
                for j in trace_jobs(name, limit, pinned)]
        r = compare(PlanningProblem(jobs, cluster(), TABLE), restart_cost_s=0.0)
        res[name] = {"jobs": len(jobs), **r}
        label = (f"{name} ({len(jobs)} jobs{', pinned' if pinned else ''}"
                 f"{f', arrivals / {denser:g}' if denser != 1 else ''})")
        print(row(label, r), flush=True)
    meta = {"machine": platform.platform(), "python": platform.python_version(),
            "command": " ".join(["python", *sys.argv]), "load": os.getloadavg()}
    Path(out).write_text(json.dumps({"meta": meta, "pool_vs_space": res}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=120, help="first N jobs of each trace")
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_gavel_replay.json"))
    ap.add_argument("--pool", action="store_true",
                    help="pool mode against space mode instead (before/after)")
    ap.add_argument("--pinned", action="store_true",
                    help="with --pool: every trace, each job on its scale factor's GPU count")
    ap.add_argument("--denser", type=float, default=1.0,
                    help="with --pool: divide every arrival time by this (more queueing)")
    args = ap.parse_args()
    if args.denser <= 0:
        ap.error("--denser must be > 0")
    if args.pool:
        pool_vs_space(args.jobs, args.out, args.pinned, args.denser)
        return
    res = {}
    for name in ("small_test.trace", "msr-seed0-0e4a51.trace"):
        if not (GAVEL / "traces" / name).is_file():
            res[name] = MISSING
            continue
        t0 = time.perf_counter()
        res[name] = run_trace(name, args.jobs)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    out = {"machine": platform.platform(), "python": platform.python_version(),
           "jobs_per_trace": args.jobs, "results": res}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
