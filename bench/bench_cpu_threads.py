"""CPU ranks sharing a node: intra-op threads per rank, each rank's step alone and side by side.

Under Slurm a CPU rank sets its torch threads with
``hetsched.runtime.launcher.cpu_threads``: the job's CPUs on the node
(``SLURM_CPUS_ON_NODE``) split between the step's tasks there
(``SLURM_STEP_TASKS_PER_NODE`` over ``SLURM_STEP_NODELIST``). Before that rule a
rank took all of the job's CPUs on the node, so the ranks of a hetjob step that
share a node oversubscribed its cores.

Method: each rank is a fresh process running the trainer's loop
(``hetsched.runtime.trainer._train``, what ``hetsched run`` runs: sampler,
feeder, step, reports) for one workload and local batch, with the Slurm
variables of a step on one node of ``--cpus`` CPUs set in its environment, so
the rank's threads come from the real rule. Three arms, one run:

* **split** (the rule now): the step's tasks on the node are given, so each of
  ``--ranks`` ranks takes ``cpus // ranks`` threads;
* **all CPUs** (the rule before): no step task count, so each rank takes all
  ``cpus`` threads, as ``cpu_threads(1)`` did;
* **OMP_NUM_THREADS=1**: the cap a user could set by hand.

Per arm: one rank alone (the same threads), then ``--ranks`` ranks started at
once (they overlap for all but their start-up). Reported: threads per rank, the
steady-state step (wall after the warm-up steps, divided by the steps; the
``done`` record of the rank's report), median over the ranks, and side by side
/ alone. Arms alternate ``--repeats`` times so a shared machine's load falls on
each alike; medians over repeats.

Usage::

    python bench/bench_cpu_threads.py [--workloads cnn,mlp] [--batch 32] [--steps 200]
        [--ranks 2] [--cpus N (default: this machine's)] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, tempfile
import torch
from hetsched.runtime.launcher import RankEnv
from hetsched.runtime.trainer import TrainConfig, _train
w, b, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with tempfile.TemporaryDirectory() as tmp:
    rep = f"{tmp}/r.jsonl"
    cfg = TrainConfig(job="j", workload=w, dataset_size=b * steps, epochs=1,
                      local_batches=[b], report=rep, checkpoint=None, device="cpu")
    _train(cfg, RankEnv(0, 1, 0, "bench-node", "127.0.0.1", 0, "1", "slurm"),
           torch.device("cpu"))
    done = [json.loads(x) for x in open(rep) if '"done"' in x][-1]
print(json.dumps({"threads": torch.get_num_threads(), "steady_step_s": done["steady_step_s"]}))
"""

ARMS = ("split", "all CPUs", "OMP_NUM_THREADS=1")


def rank_env(arm: str, cpus: int, ranks: int) -> dict[str, str]:
    """A Slurm step's variables on one node of ``cpus`` CPUs with ``ranks`` tasks."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               SLURM_CPUS_ON_NODE=str(cpus), SLURMD_NODENAME="bench-node",
               SLURM_STEP_NODELIST="bench-node", SLURM_JOB_ID="1")
    if arm != "all CPUs":
        env["SLURM_STEP_TASKS_PER_NODE"] = str(ranks)
    if arm == "OMP_NUM_THREADS=1":
        env["OMP_NUM_THREADS"] = "1"
    return env


def ranks_at_once(arm: str, n: int, cpus: int, ranks: int, workload: str, batch: int,
                  steps: int) -> list[dict[str, Any]]:
    """``n`` ranks of a step of ``ranks`` tasks on the node, started at once."""
    env = rank_env(arm, cpus, ranks)
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, workload, str(batch), str(steps)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"{arm} {workload} b={batch}: a rank failed:\n{se[-2000:]}")
        out.append(json.loads(so.strip().splitlines()[-1]))
    return out


def measure(workload: str, batch: int, steps: int, ranks: int, cpus: int, repeats: int
            ) -> list[dict[str, Any]]:
    alone: dict[str, list[float]] = {a: [] for a in ARMS}
    together: dict[str, list[float]] = {a: [] for a in ARMS}
    threads: dict[str, int] = {}
    for _ in range(repeats):
        for arm in ARMS:
            solo = ranks_at_once(arm, 1, cpus, ranks, workload, batch, steps)[0]
            alone[arm].append(solo["steady_step_s"])
            both = ranks_at_once(arm, ranks, cpus, ranks, workload, batch, steps)
            together[arm].append(statistics.median(r["steady_step_s"] for r in both))
            threads[arm] = solo["threads"]
    rows = []
    for arm in ARMS:
        a, t = statistics.median(alone[arm]), statistics.median(together[arm])
        rows.append({"workload": workload, "batch": batch, "arm": arm, "threads": threads[arm],
                     "alone_s": a, "together_s": t, "slowdown": t / a,
                     "alone_all": alone[arm], "together_all": together[arm]})
    return rows


def table(rows: list[dict[str, Any]], ranks: int) -> list[str]:
    lines = [f"workload     batch  arm                  threads/rank   alone ms   "
             f"{ranks} ranks ms   {ranks} ranks / alone"]
    for r in rows:
        lines.append(f"{r['workload']:<12} {r['batch']:>5}  {r['arm']:<20} {r['threads']:>12}"
                     f"   {r['alone_s'] * 1e3:>8.2f}   {r['together_s'] * 1e3:>10.2f}"
                     f"   {r['slowdown']:>15.2f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="cnn,mlp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=2, help="ranks of the step on the node")
    ap.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)),
                    help="the job's CPUs on the node (SLURM_CPUS_ON_NODE)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [r for w in a.workloads.split(",")
            for r in measure(w, a.batch, a.steps, a.ranks, a.cpus, a.repeats)]
    if a.json:
        print(json.dumps(rows, indent=1))
    print(f"{a.ranks} ranks of a step on one node of {a.cpus} CPUs")
    print("\n".join(table(rows, a.ranks)))


if __name__ == "__main__":
    main()
