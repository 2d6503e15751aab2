"""Helpers shared by the Slurm tests (imported by basename: tests/ has no package)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hetsched.core.plan import JobPlan, Plan, Segment
from hetsched.core.plan import Worker as PlanWorker
from hetsched.core.spec import Job
from hetsched.io.plan_json import plan_from_dict


def use_real_hetsched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``hetsched`` executable for the job steps (this interpreter, this checkout),
    set as ``HETSCHED_EXECUTABLE``: the rendered scripts run the real CLI."""
    exe = tmp_path / "hetsched"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'from hetsched.cli.main import main; "
                   "main()' \"$@\"\n")
    exe.chmod(0o755)
    monkeypatch.setenv("HETSCHED_EXECUTABLE", str(exe))
    return exe


def wait_for(cond: Callable[[], object], timeout_s: float, what: str,
             every_s: float = 0.3) -> None:
    """Poll ``cond()`` until true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


Worker = tuple[str, str, int]  # (node, gpu_type, local_batch)


def contract_plan(plan_id: str | None, jobs: dict[str, list[list[Worker]]],
              policy: str = "test") -> Plan:
    """A plan through the JSON contract (validated by plan_from_dict): job -> segments."""
    out_jobs = []
    for name, segs in jobs.items():
        t = 0.0
        segments = []
        for ws in segs:
            segments.append({"start_s": t, "end_s": t + 100.0, "workers": [
                {"node": n, "gpu_type": g, "gpu": i, "local_batch": b}
                for i, (n, g, b) in enumerate(ws)]})
            t += 100.0
        gb = sum(b for _, _, b in segs[0]) if segs else 1
        out_jobs.append({"name": name, "weight": 1.0, "arrival_s": 0.0, "start_s": 0.0,
                         "end_s": t, "spec": {"name": name, "workload": "resnet-18",
                                              "global_batch": gb, "command": ["true"],
                                              "dataset_size": 1000, "epochs": 1},
                         "segments": segments})
    plan = {"version": 1, "policy": policy,
            "objective": {"weighted_jct_s": 1.0, "avg_jct_s": 1.0, "makespan_s": 1.0},
            "lower_bound": {"weighted_jct_s": 1.0}, "jobs": out_jobs}
    if plan_id:
        plan["plan_id"] = plan_id
    return plan_from_dict(plan, "test plan")


def job_plan(d: dict) -> JobPlan:
    """A JobPlan built straight from a dict, bypassing validation (to test the templates'
    own defence against values that a validated plan could never carry)."""
    spec = d.get("spec") or {}
    job = Job(name="j", workload="w", dataset_size=1, epochs=1,
              global_batch=spec.get("global_batch", 1))
    # Job validates its fields itself now: set the raw values past it
    for key, value in (("name", d["name"]), ("workload", spec.get("workload", "w")),
                       ("command", tuple(spec["command"]) if spec.get("command") else None),
                       ("entrypoint", spec.get("entrypoint"))):
        object.__setattr__(job, key, value)
    segs = [Segment(s["start_s"], s["end_s"], [PlanWorker(w["node"], w["gpu_type"], w["gpu"],
                                                          w["local_batch"]) for w in s["workers"]])
            for s in d["segments"]]
    return JobPlan(d["name"], 1.0, 0.0, segs, spec=job)


def invoke(cmd: object, args: list[str]) -> tuple[int, str]:
    """Run a click command as the lead's ``main`` would: a HetschedError becomes
    one line of output and its exit code (standalone commands let it propagate)."""
    from click.testing import CliRunner

    from hetsched.errors import HetschedError

    res = CliRunner().invoke(cmd, args)  # type: ignore[arg-type]
    if isinstance(res.exception, HetschedError):
        return res.exception.exit_code, res.output + str(res.exception)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return res.exit_code, res.output


def throughput_rows() -> list:
    """Synthetic profiles for workload ``w`` on the testbed's a100/v100/t4."""
    from hetsched.core.throughput import ProfileRow

    return [ProfileRow("w", g, b, a + c * b) for g, a, c in
            (("a100", 0.01, 0.001), ("v100", 0.02, 0.002), ("t4", 0.04, 0.004))
            for b in (8, 16, 32, 64)]


def make_testbed_plan(client: object, jobs_yaml: str, policy: str = "fifo") -> Plan:
    """Plan ``jobs_yaml`` (text) with the real planner on the testbed's inventory."""
    import yaml

    from hetsched.core.throughput import ThroughputTable
    from hetsched.io.specs import parse_jobs
    from hetsched.planning.planner import make_plan
    from hetsched.slurm.inventory import load_cluster_from_slurm

    jobs = parse_jobs(yaml.safe_load(jobs_yaml), "test")
    cluster = load_cluster_from_slurm(client, "gpu")  # type: ignore[arg-type]
    return make_plan(jobs, cluster, ThroughputTable(throughput_rows()), policy=policy)
