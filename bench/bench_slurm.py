"""Benchmark hetsched's Slurm side on a real local testbed.

Measures (targets in brackets):

1. time to submit N planned hetjobs with ``hetsched.app.submit`` [N=100 < 20 s];
2. one monitor cycle with N jobs queued: commands run and seconds [1 command];
3. replan latency: from a node being drained to the affected pending jobs
   resubmitted (event detection + planning + sbatch/scancel).

Usage::

    python bench/bench_slurm.py [--jobs 100] [--dir /tmp/hs-bench] [--json]

It starts its own testbed (down again at the end) unless ``--dir`` names one
that is already up, which it then leaves running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hetsched.app.monitor import Monitor
from hetsched.app.replan import replan
from hetsched.app.submit import submit
from hetsched.core.spec import Job
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import make_plan
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.inventory import load_cluster_from_slurm
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store


def table() -> ThroughputTable:
    return ThroughputTable([ProfileRow("w", g, b, a + c * b) for g, a, c in
                            (("a100", 0.01, 0.001), ("v100", 0.02, 0.002), ("t4", 0.04, 0.004))
                            for b in (8, 16, 32, 64)])


def run(n_jobs: int, directory: Path, keep: bool) -> dict[str, float | int | str]:
    tb = Testbed(directory)
    started_here = not tb.is_up()
    tb.up(timeout_s=60)
    stub = tb.dir / "bench-step"
    stub.write_text("#!/bin/bash\nexec sleep 600\n")
    stub.chmod(0o755)
    os.environ["HETSCHED_EXECUTABLE"] = str(stub)
    client = CliSlurmClient(Runner(env=tb.env(), timeout_s=30))
    out: dict[str, float | int | str] = {"jobs": n_jobs}
    try:
        cluster = load_cluster_from_slurm(client, "gpu")
        jobs = [Job(name=f"bench{i:03d}", workload="w", dataset_size=20000 + 500 * i, epochs=1,
                    global_batch=64, min_gpus=3, max_gpus=3, command=("true",))
                for i in range(n_jobs)]  # runnable: the steps run a stand-in anyway
        t0 = time.perf_counter()
        plan = make_plan(jobs, cluster, table(), policy="fifo")
        out["plan_s"] = round(time.perf_counter() - t0, 3)
        state = tb.dir / f"bench-{int(time.time())}.db"
        with open_store(state) as st:
            c0 = client.runner.total()
            t0 = time.perf_counter()
            res = submit(plan, st, client, partition="gpu")
            out["submit_s"] = round(time.perf_counter() - t0, 3)
            out["submitted"] = len(res.submitted)
            comps = [len(sc.components) for sc in res.scripts.values()]
            out["hetjobs_with_2plus_components"] = sum(c > 1 for c in comps)
            out["submit_commands"] = client.runner.total() - c0
            mon = Monitor(st, client, partition="gpu")
            mon.poll()  # first cycle also records the node baseline (sinfo)
            cycle = mon.poll()
            out["monitor_cycle_commands"] = cycle.commands
            out["monitor_cycle_s"] = round(cycle.seconds, 4)
            # drain a node that pending jobs are pinned to, then replan
            pinned = {w.node for j in plan.jobs for w in j.segments[0].workers}
            node = sorted(pinned)[0]
            t0 = time.perf_counter()
            client.runner.run(["scontrol", "update", f"nodename={node}", "state=drain",
                               "reason=bench"])
            r = replan(st, client, table(), partition="gpu", policy="fifo")
            out["replan_s"] = round(time.perf_counter() - t0, 3)
            out["replan_resubmitted"] = len(r.submitted)
            out["replan_cancelled"] = len(r.cancelled)
            out["replan_updated_in_place"] = len(r.updated)
            out["drained_node"] = node
            client.runner.run(["scontrol", "update", f"nodename={node}", "state=resume"])
            client.runner.run(["scancel", "--partition", "gpu"], check=False)
    finally:
        if started_here and not keep:
            tb.down()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--dir", type=Path, default=None,
                    help="testbed directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="leave the testbed up")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="hs-bench-"))
    res = run(args.jobs, directory, args.keep)
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:>30}: {v}")
    ok = float(res["submit_s"]) < 20 and res["monitor_cycle_commands"] == 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
