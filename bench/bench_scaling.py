"""How planning time grows: jobs x GPUs for auto, jps, has, hare.

Run: python bench/bench_scaling.py [--sizes 10x36,100x360,1000x3600] [--policies auto,jps,has,hare]
                                   [--timeout 300] [--out docs/bench_scaling.json]
                                   [--baseline /tmp/base]   (before/after in one run)

Instances: Gavel's five workloads (examples/gavel_throughputs.csv) in turn,
Gavel-like sizes (1,000-50,000 iterations), weights 1/2/4, Poisson arrivals
(mean gap 30 s; the first half of the jobs arrive at 0), on a cluster of
V100:P100:K80 = 1:1:1 in nodes of 4 GPUs (300 Gbit/s in a node, 10 between).
``hare`` is pool mode. Each (size, policy) runs in its own process with a
wall-clock limit, so one slow case cannot stop the curve; ``--workers``
sets ``plan_workers`` for auto.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Node  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402

WORKLOADS = ["resnet-18", "resnet-50", "transformer", "lm", "recommendation"]
BATCH = {"resnet-18": 128, "resnet-50": 64, "transformer": 64, "lm": 40, "recommendation": 2048}


def scale_problem(n_jobs: int, n_gpus: int, seed: int = 0) -> PlanningProblem:
    rng = np.random.default_rng(seed)
    table = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
    gaps = rng.exponential(30.0, n_jobs)
    gaps[: n_jobs // 2] = 0.0
    arrivals = np.cumsum(gaps)
    specs = []
    for i in range(n_jobs):
        w = WORKLOADS[i % len(WORKLOADS)]
        specs.append(dict(name=f"j{i:05d}", workload=w, global_batch=BATCH[w], epochs=1,
                          dataset_size=int(BATCH[w] * rng.integers(1_000, 50_000)),
                          weight=float(rng.choice([1, 2, 4])),
                          arrival_s=round(float(arrivals[i]), 3)))
    nodes = []
    per_type = n_gpus // 3
    for t in ("v100", "p100", "k80"):
        for k in range(per_type // 4):
            nodes.append(Node(f"{t}-{k}", t, 4))
        if per_type % 4:
            nodes.append(Node(f"{t}-x", t, per_type % 4))
    cl = Cluster(nodes=tuple(nodes), intra_node_gbps=300.0, inter_node_gbps=10.0)
    return PlanningProblem(parse_jobs(specs, "bench"), cl, table)


def _one(n_jobs: int, n_gpus: int, policy: str, workers: int, q: Any) -> None:
    os.environ["HETSCHED_PLAN_WORKERS"] = str(workers)
    from hetsched.core.report import RecordingReporter
    from hetsched.planning.planner import plan_problem
    from hetsched.planning.pool import plan_pool

    p = scale_problem(n_jobs, n_gpus)
    rep = RecordingReporter()
    t0 = time.perf_counter()
    try:
        if policy == "hare":
            plan = plan_pool(p, "hare", reporter=rep)
        else:
            plan = plan_problem(p, policy, reporter=rep)
        dt = time.perf_counter() - t0
        q.put({"seconds": round(dt, 3), "policy": plan.policy,
               "weighted_jct_s": round(plan.weighted_jct_s, 1),
               "lower_bound_s": round(plan.lower_bound_s, 1),
               "skipped": plan.notes.skipped or {},
               "candidates": {k: round(v, 1) for k, v in plan.candidates.items()}})
    except Exception as e:  # noqa: BLE001 - recorded, the curve goes on
        q.put({"seconds": round(time.perf_counter() - t0, 3),
               "error": f"{type(e).__name__}: {e}"[:300]})


def measure(n_jobs: int, n_gpus: int, policy: str, timeout: float, workers: int
            ) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_one, args=(n_jobs, n_gpus, policy, workers, q))
    t0 = time.perf_counter()
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"seconds": None, "error": f"timeout after {timeout:g} s"}
    try:
        res: dict[str, Any] = q.get(timeout=5)
    except Exception:  # noqa: BLE001 - the child died (memory)
        res = {"seconds": round(time.perf_counter() - t0, 3),
               "error": f"process died (exit {proc.exitcode})"}
    return res


def _baseline(root: Path, size: str, pol: str, timeout: float, workers: int) -> dict[str, Any]:
    """One case measured by the baseline checkout's own copy of this script."""
    import subprocess

    cmd = [sys.executable, str(root / "bench" / "bench_scaling.py"), "--sizes", size,
           "--policies", pol, "--timeout", str(timeout), "--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout + 60)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"seconds": None, "error": f"baseline run failed: {res.stderr[-300:]}"}
    got: dict[str, Any] = json.loads(lines[-1])
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10x36,100x360,1000x3600")
    ap.add_argument("--policies", default="auto,jps,has,hare")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=0, help="plan_workers for auto (0: cores)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--baseline", type=Path,
                    help="another checkout (e.g. `git worktree add /tmp/base <commit>`): each "
                    "case is also run there, right before this one, for before/after in one run")
    args = ap.parse_args()
    out: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}, "
                           f"{os.cpu_count()} cores, Python {platform.python_version()}",
                           "command": " ".join(["python", *sys.argv]), "results": []}
    for size in args.sizes.split(","):
        n_jobs, n_gpus = (int(v) for v in size.split("x"))
        for pol in args.policies.split(","):
            if args.baseline is not None:
                b = _baseline(args.baseline, size, pol, args.timeout, args.workers)
                b.update({"jobs": n_jobs, "gpus": n_gpus, "request": pol, "tree": "baseline"})
                out["results"].append(b)
                print(json.dumps(b), flush=True)
            r = measure(n_jobs, n_gpus, pol, args.timeout, args.workers)
            r.update({"jobs": n_jobs, "gpus": n_gpus, "request": pol})
            out["results"].append(r)
            print(json.dumps(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
