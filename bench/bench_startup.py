"""How fast a process reaches its first step: ``hetsched run`` and ``hetsched probe``
against torch's own import, side by side.

Method, ``--repeats`` times, alternating:

* ``python -c "import torch"``: torch's own import (the floor every rank pays);
* ``hetsched run --plan P --job j`` of a one-rank mlp job (one process, no
  Slurm): the ``done`` record's ``start_to_first_step_s`` (process start to the
  end of its first step, from ``/proc``), and the command's wall time;
* ``hetsched probe --workload mlp --batches 8 --steps 2 --no-sync``: wall time.

Target: start-to-first-step minus torch's import under 3 s on CPU.

Usage::

    python bench/bench_startup.py [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from hetsched.cli.main import main; sys.argv[0] = 'hetsched'; main()"


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_"))}
    e.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return e


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, env=env(), timeout=600)
    return time.perf_counter() - t0


def make_plan(tmp: Path) -> Path:
    (tmp / "jobs.yaml").write_text(
        "jobs:\n  - {name: j, workload: mlp, dataset_size: 256, epochs: 1, global_batch: 32}\n")
    (tmp / "cluster.yaml").write_text(
        "name: b\nnodes:\n  - {names: n1, gpu_type: v100, gpus: 1, gpu_memory_gb: 16}\n")
    (tmp / "tp.csv").write_text("workload,gpu_type,local_batch,step_time_s\n"
                                "mlp,v100,8,0.01\nmlp,v100,32,0.02\n")
    out = tmp / "plan.json"
    subprocess.run([sys.executable, "-c", MAIN, "plan", str(tmp / "jobs.yaml"), "--cluster",
                    str(tmp / "cluster.yaml"), "--throughputs", str(tmp / "tp.csv"), "--out",
                    str(out)], check=True, capture_output=True, env=env())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    res: dict[str, list[float]] = {"torch": [], "run_first_step": [], "run_wall": [],
                                   "probe_wall": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        plan = make_plan(tmp)
        for k in range(a.repeats):
            res["torch"].append(timed([sys.executable, "-c", "import torch"]))
            rep = tmp / f"r{k}.jsonl"
            res["run_wall"].append(timed([sys.executable, "-c", MAIN, "run", "--plan", str(plan),
                                          "--job", "j", "--device", "cpu", "--report", str(rep),
                                          "--checkpoint", str(tmp / f"c{k}.pt")]))
            done = [json.loads(x) for x in rep.read_text().splitlines() if '"done"' in x][-1]
            res["run_first_step"].append(float(done["start_to_first_step_s"]))
            res["probe_wall"].append(timed([sys.executable, "-c", MAIN, "probe", "--workload",
                                            "mlp", "--gpu-type", "v100", "--batches", "8",
                                            "--steps", "2", "--no-sync", "--device", "cpu",
                                            "--out", str(tmp / f"p{k}.csv")]))
    med = {k: statistics.median(v) for k, v in res.items()}
    if a.json:
        print(json.dumps(res, indent=1))
    print(f"medians of {a.repeats}, seconds (CPU, OMP_NUM_THREADS=1)")
    print(f"import torch                         {med['torch']:.2f}")
    print(f"hetsched run: start to first step    {med['run_first_step']:.2f}   "
          f"(beyond torch's import: {med['run_first_step'] - med['torch']:.2f})")
    print(f"hetsched run: wall (8 steps)         {med['run_wall']:.2f}")
    print(f"hetsched probe: wall (1 batch size)  {med['probe_wall']:.2f}   "
          f"(beyond torch's import: {med['probe_wall'] - med['torch']:.2f})")


if __name__ == "__main__":
    main()
