"""Benchmark the runtime on the testbed: heterogeneous step efficiency and probe cost.

Method (targets in brackets):

* A testbed with one a100 and one v100 node (fake GPUs on this CPU) and
  **emulated speeds** a100=2, v100=1 (``HETSCHED_EMULATE_SPEED``, test-only:
  each compute step is padded to ``(a + c*b)/speed`` seconds, default
  ``a=0.04 s, c=0.008 s/sample``; see docs/runtime.md).
* ``hetsched profile`` probes every (workload, GPU type) through Slurm;
  probe cost = seconds from the probe job starting to its end, per pair.
* For each workload a job (global batch 48, 40 steps) is planned with the HAS
  policy on {a100-1, v100-1} from the profile history and submitted; the same
  job with equal shares (24/24) is submitted next. Both run the real
  ``hetsched run`` in one ``srun --het-group=0,1`` step.
* Reported per workload: measured iteration time (rank 0's epoch wall time
  over its steps, from its report, and the steady state after the first 10
  warm-up steps), the model's prediction (the plan's
  iteration time = slowest worker's step with the optimal shares + measured
  sync), the compute-only ideal (slowest worker's step, no sync), their
  ratios [measured/predicted within 10 %], the speed-up over equal shares
  [>= 1.3x with a 2:1 speed difference], and the prediction after the run's
  reports refined the profile history (``hetsched profiles refine``, EWMA).

Usage::

    python bench/bench_runtime.py [--dir /tmp/hs-rt-bench] [--workloads mlp,cnn,transformer]
                                  [--cost 0.04,0.008] [--json]

Starts its own testbed (down again at the end) unless ``--dir`` names one
that is already up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hetsched.app.profile import probe_times
from hetsched.core.model import balanced_shares, equal_shares
from hetsched.core.spec import Cluster, Job, Node
from hetsched.planning.planner import make_plan
from hetsched.slurm.testbed import Testbed
from hetsched.state.history import table_from_store
from hetsched.state.store import open_store

B = 48
STEPS = 40



def job_report(work: Path, job: str) -> Path:
    """A job's report: REPORTS/BATCH/JOB.jsonl (io/jobfiles.py); one batch per job here."""
    [path] = (work / "reports").glob(f"*/{job}.jsonl")
    return path

def hetsched(*args: str, env: dict[str, str]) -> str:
    res = subprocess.run([sys.executable, "-c", "from hetsched.cli.main import main; main()", *args],
                         env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"hetsched {' '.join(args)} failed ({res.returncode}):\n"
                         f"{res.stdout}{res.stderr}")
    return res.stdout


def wait_done(env: dict[str, str], job: str, timeout: float = 180) -> str:
    from hetsched.slurm.client import CliSlurmClient
    from hetsched.slurm.runner import Runner

    with open_store(env["HETSCHED_STATE"]) as st:
        sid = next(s.slurm_id for s in st.submissions() if s.job == job)
    client = CliSlurmClient(Runner(env=env, timeout_s=20))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        js = [j for j in client.jobs() if j.leader == sid]
        if js and all(j.finished for j in js):
            return js[0].state
        time.sleep(1.0)
    raise SystemExit(f"job {job} (Slurm {sid}) did not finish in {timeout} s")


def measured(report: Path) -> dict[str, float]:
    recs = [json.loads(x) for x in report.read_text().splitlines()]
    epoch = next(r for r in recs if r["kind"] == "epoch")
    r0 = [r for r in recs if r["kind"] == "steps" and r["rank"] == 0]
    return {"epoch_s": float(epoch["time_s"]), "iter_s": float(epoch["time_s"]) / epoch["steps"],
            "steady_iter_s": sum(r["step_s"] * r["n"] for r in r0[1:]) /
            max(1, sum(r["n"] for r in r0[1:])),
            "sync_s": sum(r["sync_s"] * r["n"] for r in r0) / max(1, sum(r["n"] for r in r0))}


def run(directory: Path, workloads: list[str], cost: str) -> dict[str, Any]:
    tb = Testbed(directory, nodes="a100:1x1,v100:1x1")
    started_here = not tb.is_up()
    tb.up(timeout_s=60)
    work = Path(tempfile.mkdtemp(prefix="hs-rt-bench-"))
    exe = work / "hetsched"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from hetsched.cli.main import main; "
                   "main()' \"$@\"\n")
    exe.chmod(0o755)
    env = {**os.environ, **tb.env(), "HETSCHED_EXECUTABLE": str(exe),
           "HETSCHED_EMULATE_SPEED": "a100=2,v100=1", "HETSCHED_EMULATE_COST": cost,
           "HETSCHED_REPORT_DIR": str(work / "reports"),
           "HETSCHED_CHECKPOINT_DIR": str(work / "ckpt")}
    out: dict[str, Any] = {"emulated": {"speed": "a100=2,v100=1", "cost_a_c": cost},
                           "global_batch": B, "steps": STEPS, "workloads": {}}
    try:
        jobs = [Job(f"{w}-het", w, B * STEPS, 1, B, min_gpus=2, max_gpus=2) for w in workloads]
        jobs_yaml = work / "jobs.yaml"
        jobs_yaml.write_text(json.dumps({"jobs": [j.to_dict() for j in jobs]}))
        t0 = time.monotonic()
        prof = json.loads(hetsched("profile", str(jobs_yaml), "--batches", "8,16,32,48",
                                   "--time-limit", "120", "--json", env=env))
        out["profile_wall_s"] = round(time.monotonic() - t0, 2)
        out["probes"] = prof["probes"]
        with open_store(env["HETSCHED_STATE"]) as st:
            table = table_from_store(st)
            out["probe_cost_s"] = {f"{w}/{g}": round(s, 2) for (w, g), s in
                                   sorted(probe_times(st).items())}
        cluster = Cluster((Node("a100-1", "a100", 1), Node("v100-1", "v100", 1)))
        for job in jobs:
            w = job.workload
            plan = make_plan([job], cluster, table, policy="has").to_dict()
            seg = plan["jobs"][0]["segments"][0]
            fits = {g: table.get(w, g) for g in ("a100", "v100")}
            a = [fits["a100"].a, fits["v100"].a]  # type: ignore[union-attr]
            c = [fits["a100"].c, fits["v100"].c]  # type: ignore[union-attr]
            caps = [fits["a100"].max_batch, fits["v100"].max_batch]  # type: ignore[union-attr]
            opt = balanced_shares(a, c, caps, B)
            eq = equal_shares(caps, B)
            ideal = max(a[k] + c[k] * opt[k] for k in range(2))
            eq_model = max(a[k] + c[k] * eq[k] for k in range(2))
            p_het = work / f"{w}-het.json"
            p_het.write_text(json.dumps(plan))
            hetsched("submit", str(p_het), env=env)
            st_het = wait_done(env, job.name)
            # close the loop: the run's reports refine the history (EWMA), replan
            hetsched("profiles", "refine", str(job_report(work, f"{w}-het")), env=env)
            with open_store(env["HETSCHED_STATE"]) as st:
                refined = make_plan([job], cluster, table_from_store(st), policy="has"
                                    ).to_dict()["jobs"][0]["segments"][0]
            eq_plan = json.loads(json.dumps(plan))
            eq_plan.pop("plan_id")
            eq_plan["jobs"][0]["name"] = eq_plan["jobs"][0]["spec"]["name"] = f"{w}-eq"
            order = {"a100": 0, "v100": 1}
            for wk in eq_plan["jobs"][0]["segments"][0]["workers"]:
                wk["local_batch"] = eq[order[wk["gpu_type"]]]
            p_eq = work / f"{w}-eq.json"
            p_eq.write_text(json.dumps(eq_plan))
            hetsched("submit", str(p_eq), env=env)
            st_eq = wait_done(env, f"{w}-eq")
            mh = measured(job_report(work, f"{w}-het"))
            me = measured(job_report(work, f"{w}-eq"))
            out["workloads"][w] = {
                "states": [st_het, st_eq],
                "shares": {wk["gpu_type"]: wk["local_batch"] for wk in seg["workers"]},
                "equal_shares": eq,
                "predicted_iter_s": round(seg["iteration_s"], 5),
                "ideal_compute_s": round(ideal, 5),
                "equal_model_s": round(eq_model + seg["comm_s"], 5),
                "measured_iter_s": round(mh["iter_s"], 5),
                "steady_iter_s": round(mh["steady_iter_s"], 5),
                "measured_sync_s": round(mh["sync_s"], 5),
                "measured_equal_iter_s": round(me["iter_s"], 5),
                "steady_equal_iter_s": round(me["steady_iter_s"], 5),
                "measured_over_predicted": round(mh["iter_s"] / seg["iteration_s"], 3),
                "steady_over_predicted": round(mh["steady_iter_s"] / seg["iteration_s"], 3),
                "measured_over_ideal": round(mh["iter_s"] / ideal, 3),
                "steady_over_ideal": round(mh["steady_iter_s"] / ideal, 3),
                "refined_predicted_iter_s": round(refined["iteration_s"], 5),
                "steady_over_refined": round(mh["steady_iter_s"] / refined["iteration_s"], 3),
                "speedup_vs_equal": round(me["iter_s"] / mh["iter_s"], 3),
                "steady_speedup_vs_equal": round(me["steady_iter_s"] / mh["steady_iter_s"], 3),
                "predicted_epoch_s": round(seg["iteration_s"] * math.ceil(job.dataset_size / B),
                                           3),
                "measured_epoch_s": round(mh["epoch_s"], 3),
                "measured_equal_epoch_s": round(me["epoch_s"], 3),
            }
    finally:
        if started_here:
            tb.down()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=None, help="testbed directory")
    ap.add_argument("--workloads", default="mlp,cnn,transformer")
    ap.add_argument("--cost", default="0.04,0.008", help="emulated a,c seconds at speed 1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    d = args.dir or Path(tempfile.mkdtemp(prefix="hs-rt-tb-"))
    res = run(d, [w for w in args.workloads.split(",") if w], args.cost)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"profile: {len(res['probes'])} probes in {res['profile_wall_s']} s (concurrent); "
          "probe cost per pair (s): " + ", ".join(f"{k} {v}" for k, v in
                                                   res["probe_cost_s"].items()))
    print("iteration times in s; 'epoch' = epoch wall time / steps (includes warm-up), "
          "'steady' = after the first 10 steps")
    print(f"{'workload':<12} {'shares':<16} {'pred':>7} {'ideal':>7} {'epoch':>7} {'steady':>7} "
          f"{'st/pred':>7} {'st/ideal':>8} {'refined':>7} {'st/ref':>6} {'equal':>7} "
          f"{'speed-up (epoch, steady)':>24}")
    for w, r in res["workloads"].items():
        sh = "/".join(f"{g}:{b}" for g, b in r["shares"].items())
        print(f"{w:<12} {sh:<16} {r['predicted_iter_s']:>7.4f} {r['ideal_compute_s']:>7.4f} "
              f"{r['measured_iter_s']:>7.4f} {r['steady_iter_s']:>7.4f} "
              f"{r['steady_over_predicted']:>7.3f} {r['steady_over_ideal']:>8.3f} "
              f"{r['refined_predicted_iter_s']:>7.4f} {r['steady_over_refined']:>6.3f} "
              f"{r['measured_equal_iter_s']:>7.4f} "
              f"{r['speedup_vs_equal']:>11.2f}x, {r['steady_speedup_vs_equal']:.2f}x")


if __name__ == "__main__":
    main()
