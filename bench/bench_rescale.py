"""Rescale overhead on the testbed: in place vs checkpoint-restart.

Real Slurm (the local testbed, fake GPUs on this CPU), the real runtime
(``hetsched run`` in the hetjob's ``srun`` step, CPU torch, two gloo ranks):

1. an elastic ``mlp`` job (global batch 16 on 2 GPUs, ``elastic: {min_batch: 8,
   max_batch: 64, lr_scaling: linear}``) is planned and submitted with
   ``hetsched submit``;
2. **in place**: while it trains, rescale requests with the same two ranks
   and another batch (the file ``hetsched replan`` writes,
   ``CHECKPOINT.rescale.json``) are applied at a step boundary without
   restarting; measured: the ``rescale`` report's ``pause_s`` (broadcast of
   the request, new sampler shares, new learning rate), the median step time
   around it, and the latency from writing the request to its application
   (training goes on meanwhile, so this is not lost time);
3. **checkpoint-restart**: a request for three ranks makes the ranks
   checkpoint and stop (reason ``rescale``); the bench then submits the job's
   next segment on three GPUs, which resumes from the checkpoint. Measured:
   checkpoint-and-stop (the request's step to the ``stopped`` record), the
   stop to Slurm releasing the old job (``hetsched submit`` refuses the job
   while it is live), submission to the first resumed step (``sbatch``, Slurm's scheduling,
   process start, torch import, rendezvous, checkpoint load) and the total
   training time lost, from the stop to the first resumed step. The bench
   resubmits as soon as it sees the stop (0.2 s polls); a cron-driven
   ``replan`` adds its own polling interval on top.

    python bench/bench_rescale.py [--dir TESTBED_DIR] [--repeats 3] [--json OUT]

Starts its own testbed (down again at the end) unless ``--dir`` names one that
is already up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetsched.core.plan import Plan  # noqa: E402
from hetsched.core.spec import Cluster, Elastic, Job, Node  # noqa: E402
from hetsched.core.throughput import ProfileRow, ThroughputTable  # noqa: E402
from hetsched.io.reports import iter_records  # noqa: E402
from hetsched.planning.planner import make_plan  # noqa: E402
from hetsched.runtime.elastic import request_path, write_request  # noqa: E402
from hetsched.slurm.testbed import Testbed  # noqa: E402

JOB = "rescale-mlp"


def hetsched(*args: str, env: dict[str, str]) -> str:
    res = subprocess.run([sys.executable, "-c", "from hetsched.cli.main import main; main()",
                          *args], env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"hetsched {' '.join(args)} failed ({res.returncode}):\n"
                         f"{res.stdout}{res.stderr}")
    return res.stdout


def wait(cond: Any, timeout_s: float, what: str, poll_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise SystemExit(f"timed out after {timeout_s:g} s waiting for {what}")


def plan_on(gpus: int, batch: int) -> Plan:
    """The job planned on ``gpus`` v100 GPUs of one node at global batch ``batch``."""
    job = Job(JOB, "mlp", 4_000_000, 1, batch, min_gpus=gpus, max_gpus=gpus,
              elastic=Elastic(8, 64, "linear"))
    table = ThroughputTable([ProfileRow("mlp", "v100", b, 0.002 + 0.0001 * b, 0.001, 64)
                             for b in (4, 8, 16, 32)])
    cluster = Cluster((Node("v100-1", "v100", 4),))
    return make_plan([job], cluster, table, policy="has")


def records(report: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in iter_records(report, kind) if r.get("rank", 0) == 0] \
        if report.exists() else []


def in_place(report: Path, req: Path, repeats: int) -> dict[str, Any]:
    rows = []
    shares = [[12, 12], [16, 8], [8, 8], [20, 12], [8, 16]]
    for k in range(repeats):
        before = len(records(report, "rescale"))
        t_req = time.time()
        write_request(req, shares[k % len(shares)])
        rec = wait(lambda b=before: records(report, "rescale")[b:], 120, "in-place rescale")[0]
        if not rec.get("in_place"):
            raise SystemExit(f"rescale {rec} was not applied in place")
        rows.append({"pause_s": rec["pause_s"], "latency_s": rec["t"] - t_req,
                     "new": rec["new"]})
        time.sleep(1.0)
    steps = [r["step_s"] for r in records(report, "steps")]
    return {"rescales": rows, "pause_s_median": statistics.median(r["pause_s"] for r in rows),
            "pause_s_max": max(r["pause_s"] for r in rows),
            "request_to_applied_s_median": statistics.median(r["latency_s"] for r in rows),
            "step_s_median": statistics.median(steps)}


def restart(report: Path, req: Path, env: dict[str, str], work: Path,
            batch: str) -> dict[str, Any]:
    t_req = time.time()
    write_request(req, [8, 8, 8])  # three ranks: cannot be applied in place
    stopped = wait(lambda: [r for r in records(report, "stopped")
                            if r.get("reason") == "rescale"], 180, "checkpoint and stop")[0]
    resc = [r for r in records(report, "rescale") if not r.get("in_place")][-1]
    seen = len(records(report, "steps"))
    plan = plan_on(3, 24)
    plan.notes.batches = {JOB: batch}  # the same job, continued: its checkpoint
    p = work / "plan3.json"
    p.write_text(plan.to_json())
    old = slurm_ids(work)

    def released() -> bool:  # submit refuses the job while Slurm still runs the old one
        q = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(old)], env=env,
                           capture_output=True, text=True)
        return not q.stdout.strip()

    wait(released, 120, "Slurm to release the stopped job")
    t_released = time.time()
    t_submit = time.time()
    hetsched("submit", str(p), env=env)
    first = wait(lambda: records(report, "steps")[seen:], 300, "the resumed run's steps",
                 poll_s=0.5)[0]
    first_step_start = first["t"] - first["n"] * first["step_s"]
    return {"request_to_stopped_s": stopped["t"] - t_req,
            "checkpoint_and_stop_s": stopped["t"] - resc["t"],
            "stop_to_released_s": t_released - stopped["t"],
            "submit_to_first_step_s": first_step_start - t_submit,
            "stop_to_first_step_s": first_step_start - stopped["t"],
            "resumed_at_step": first["step"] - first["n"], "stopped_at_step": stopped["steps"]}


def slurm_ids(work: Path) -> list[str]:
    """This bench's own submissions (from its state file)."""
    from hetsched.state.store import open_store

    if not (work / "state.db").exists():
        return []
    with open_store(work / "state.db") as st:
        return [s.slurm_id for s in st.submissions() if s.slurm_id]


def run(directory: Path, repeats: int) -> dict[str, Any]:
    tb = Testbed(directory, nodes="v100:1x4")
    started_here = not tb.is_up()
    tb.up(timeout_s=90)
    work = Path(tempfile.mkdtemp(prefix="hs-rescale-"))
    exe = work / "hetsched"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from hetsched.cli.main import main; "
                   "main()' \"$@\"\n")
    exe.chmod(0o755)
    env = {**os.environ, **tb.env(), "HETSCHED_EXECUTABLE": str(exe),
           "HETSCHED_STATE": str(work / "state.db"), "OMP_NUM_THREADS": "1",
           "HETSCHED_REPORT_DIR": str(work / "reports"),
           "HETSCHED_CHECKPOINT_DIR": str(work / "ckpt")}
    first_plan = plan_on(2, 16)
    batch = str(json.loads(first_plan.to_json())["plan_id"])  # io/jobfiles.py
    report = work / "reports" / batch / f"{JOB}.jsonl"
    req = request_path(work / "ckpt" / batch / f"{JOB}.pt")
    out: dict[str, Any] = {"machine": platform.platform(), "cpus": os.cpu_count(),
                           "testbed": "v100:1x4 (fake GPUs, CPU torch, gloo)"}
    try:
        p = work / "plan2.json"
        p.write_text(first_plan.to_json())
        t0 = time.time()
        hetsched("submit", str(p), env=env)
        first = wait(lambda: records(report, "steps"), 300, "the job's first steps", 0.5)[0]
        out["first_start_s"] = first["t"] - first["n"] * first["step_s"] - t0
        wait(lambda: sum(r["n"] for r in records(report, "steps")) >= 40, 120, "40 steps")
        out["in_place"] = in_place(report, req, repeats)
        out["checkpoint_restart"] = restart(report, req, env, work, batch)
    finally:
        ids = slurm_ids(work)  # this bench's own submissions only
        if ids:
            subprocess.run(["scancel", *ids], env=env, capture_output=True)
        if started_here:
            tb.down()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="testbed directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = run(a.dir or Path(tempfile.mkdtemp(prefix="hs-rescale-tb-")), a.repeats)
    ip, cr = res["in_place"], res["checkpoint_restart"]
    print(f"in place: pause {ip['pause_s_median'] * 1000:.1f} ms median "
          f"(max {ip['pause_s_max'] * 1000:.1f} ms, {len(ip['rescales'])} rescales; "
          f"median step {ip['step_s_median'] * 1000:.1f} ms; request applied "
          f"{ip['request_to_applied_s_median']:.2f} s after writing, training meanwhile)")
    print(f"checkpoint-restart: checkpoint and stop {cr['checkpoint_and_stop_s']:.2f} s, "
          f"Slurm released the job {cr['stop_to_released_s']:.2f} s after the stop, "
          f"submit to first resumed step {cr['submit_to_first_step_s']:.2f} s, "
          f"training lost {cr['stop_to_first_step_s']:.2f} s "
          f"(target in place <= 0.5 s; ONES: ~1 s vs > 20 s)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
