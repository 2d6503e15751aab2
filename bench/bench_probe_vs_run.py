"""Probe step vs ``hetsched run``'s steady-state step, side by side, per built-in workload.

Method: for each workload and local batch, one fresh process (torch imported
once, ``OMP_NUM_THREADS`` threads) alternates ``repeats`` times between

* the probe's measurement (``hetsched.runtime.probe.probe``: its warm-up, then
  its timed steps; the row's ``step_time_s``), and
* a one-rank training run of the same workload and local batch
  (``hetsched.runtime.trainer``, what ``hetsched run`` runs in each rank:
  sampler, feeder, step, reports; ``steps`` steps, no checkpoint), whose
  ``done`` record gives the steady-state mean step (``steady_step_s``: wall
  after the first ``WARMUP_STEPS`` steps, divided by the steps).

The probe times as many steps as the run's steady state has (``steps`` minus
the warm-up), at least ``--steps`` and enough for about one second (a quick
5-step probe sizes it): with a few milliseconds per step, ten steps are within
the reach of one scheduler hiccup of a shared machine. It prints the medians and
run / probe (target: within 10 %, i.e. 0.9-1.1).
Alternating in one process puts both under the same load of a shared machine.
On a GPU (``--device cuda``) the same, with the data path of runtime/step.py.

Usage::

    python bench/bench_probe_vs_run.py [--device cpu|cuda] [--workloads mlp,cnn,transformer]
        [--batches 16,64] [--steps 100] [--repeats 3] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, tempfile, time
import torch
from hetsched.runtime.launcher import RankEnv
from hetsched.runtime.probe import probe
from hetsched.runtime.step import WARMUP_STEPS
from hetsched.runtime.trainer import TrainConfig, _train
w, b, steps, repeats, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
# at least ~1 s of steady state per measurement: a scheduler hiccup of a shared
# machine is then a few per cent of it, not the whole measurement
# max_batch=b: on a GPU the probe otherwise doubles the batch up to 4,096 looking for the
# memory limit, at the same number of steps (most of a GPU case's time)
t = probe(w, "bench", [b], steps=5, device=device, sync=False, max_batch=b).rows[0].step_time_s
steps = int(min(4000, max(steps, 1.0 / max(t, 1e-6))))
pr, rn, firsts = [], [], []
with tempfile.TemporaryDirectory() as tmp:
    for k in range(repeats):
        # the same number of timed steps as the run's steady state
        res = probe(w, "bench", [b], steps=steps - WARMUP_STEPS, device=device, sync=False,
                    dataset_size=b * steps, max_batch=b)  # the run's data set: gathers read as much memory
        pr.append(res.rows[0].step_time_s)
        rep = f"{tmp}/r{k}.jsonl"
        cfg = TrainConfig(job="j", workload=w, dataset_size=b * steps, epochs=1,
                          local_batches=[b], report=rep, checkpoint=None, device=device)
        _train(cfg, RankEnv(0, 1, 0, "h", "127.0.0.1", 0, "", "single"), dev)
        done = [json.loads(x) for x in open(rep) if '"done"' in x][-1]
        rn.append(done["steady_step_s"])
        firsts.append(done.get("start_to_first_step_s"))
print(json.dumps({"probe": statistics.median(pr), "run": statistics.median(rn), "steps": steps,
                  "probe_all": pr, "run_all": rn, "start_to_first_step_s": firsts[0]}))
"""


def one(workload: str, batch: int, steps: int, repeats: int, device: str, threads: int
        ) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", CHILD, workload, str(batch), str(steps),
                        str(repeats), device], capture_output=True, text=True, env=env,
                       timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{workload} b={batch} failed:\n{r.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    out.update(workload=workload, batch=batch, ratio=out["run"] / out["probe"])
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["workload     batch   steps   probe step ms   run steady step ms   run/probe"]
    for r in rows:
        lines.append(f"{r['workload']:<12} {r['batch']:>5}   {r['steps']:>5}   "
                     f"{r['probe'] * 1e3:>13.3f}   {r['run'] * 1e3:>18.3f}   {r['ratio']:>9.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--workloads", default="mlp,cnn,transformer")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--steps", type=int, default=100, help="at least this many steps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [one(w, int(b), a.steps, a.repeats, a.device, a.threads)
            for w in a.workloads.split(",") for b in a.batches.split(",")]
    if a.json:
        print(json.dumps(rows, indent=1))
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
