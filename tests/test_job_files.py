"""Every path of a job under its batch (io/jobfiles.py): a later batch that reuses job
names starts afresh (checkpoints, reports, status); a replan keeps a job's batch.

Real components: the in-memory Slurm, SQLite, the runtime on CPU (torch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hetsched.app.monitor import Monitor
from hetsched.app.replan import replan
from hetsched.app.status import batch_status
from hetsched.app.submit import files_dir, submit
from hetsched.core.plan import Plan
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.io.jobfiles import JobFiles, batch_of, plan_copy
from hetsched.io.plan_json import plan_from_dict
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = (("v100-1", "v100", 2),)


def _plan(plan_id: str, dataset_size: int) -> Plan:
    """One job ``j`` (the built-in mlp) on one v100; ``dataset_size`` tells batches apart."""
    spec = {"name": "j", "workload": "mlp", "global_batch": 8, "dataset_size": dataset_size,
            "epochs": 1, "gpu_types": ["v100"], "min_gpus": 1, "max_gpus": 1}
    return plan_from_dict({
        "version": 1, "policy": "test", "plan_id": plan_id,
        "objective": {"weighted_jct_s": 1.0, "avg_jct_s": 1.0, "makespan_s": 1.0},
        "lower_bound": {"weighted_jct_s": 1.0},
        "jobs": [{"name": "j", "weight": 1.0, "arrival_s": 0.0, "start_s": 0.0,
                  "end_s": 100.0, "spec": spec, "segments": [
                      {"start_s": 0.0, "end_s": 100.0, "workers": [
                          {"node": "v100-1", "gpu_type": "v100", "gpu": 0,
                           "local_batch": 8}]}]}]}, "test plan")


def _run(plan_path: Path) -> dict[str, Any] | None:
    """``hetsched run --local`` of job j, two steps on CPU."""
    from hetsched.runtime.job import run

    return run(str(plan_path), "j", local=True,
               overrides={"max_steps": 2, "device": "cpu", "checkpoint_every": 1})


def test_paths_are_scoped_by_plan_submission_and_batch(tmp_path: Path) -> None:
    a = JobFiles(tmp_path, "p1", "j", 0, "p1")
    b = JobFiles(tmp_path, "p2", "j", 1, "p1")  # a replan's plan p2 continuing batch p1
    assert a.checkpoint == b.checkpoint and a.report == b.report  # the job resumes
    assert a.layout != b.layout and a.script != b.script  # each submission its own
    assert a.plan_copy == plan_copy(tmp_path, "p1")
    other = JobFiles(tmp_path, "p3", "j", 0, "p3")  # a later batch reusing the name
    assert other.checkpoint != a.checkpoint and other.report != a.report
    assert a.secret.parent == a.private_dir != other.private_dir


@pytest.mark.slow
def test_second_batch_reusing_a_name_starts_afresh(tmp_path: Path, monkeypatch) -> None:
    """Batch 2's job j (16000 samples) must not resume batch 1's checkpoint of j (8000),
    and `status` must not show batch 1's measurements for it while it waits."""
    pytest.importorskip("torch")
    monkeypatch.setenv("HETSCHED_STATE", str(tmp_path / "elsewhere.db"))  # not the job's
    for var in ("HETSCHED_CHECKPOINT_DIR", "HETSCHED_REPORT_DIR"):
        monkeypatch.delenv(var, raising=False)
    slurm = MemorySlurm(nodes_spec=NODES)
    with open_store(tmp_path / "s.db") as st:
        root = files_dir(st)
        first = _plan("batch1", 8000)
        ids = dict(submit(first, st, slurm).submitted)
        _run(plan_copy(root, "batch1"))
        f1 = JobFiles.of(root, first, "j")
        assert f1.checkpoint.exists() and f1.report.exists()  # beside the state file
        slurm.schedule()
        slurm.finish(ids["j"])
        Monitor(st, slurm).poll()

        second = _plan("batch2", 16000)
        submit(second, st, slurm)
        [row] = [s for s in batch_status(st, slurm) if s.job == "j"]
        assert row.plan_id == "batch2" and row.measured_iter_s is None
        assert _run(plan_copy(root, "batch2")) is not None  # no "dataset of 8000" refusal
        f2 = JobFiles.of(root, second, "j")
        assert f2.checkpoint.exists() and f2.checkpoint != f1.checkpoint
        steps = [json.loads(x) for x in f2.report.read_text().splitlines()]
        assert steps and all(r.get("dataset_size", 16000) == 16000 for r in steps)


def test_replan_keeps_a_jobs_batch(tmp_path: Path) -> None:
    """A job moved by replan belongs to the batch it was first submitted with."""
    slurm = MemorySlurm(nodes_spec=(("v100-1", "v100", 4), ("v100-2", "v100", 4)))
    table = ThroughputTable([ProfileRow("mlp", "v100", b, 0.01 + 0.001 * b)
                             for b in (4, 8, 16)])
    with open_store(tmp_path / "s.db") as st:
        submit(_plan("first", 8000), st, slurm)
        slurm.schedule()
        Monitor(st, slurm).poll()
        res = replan(st, slurm, table, policy="fifo", force=True)
        assert res.new_plan_id and res.new_plan_id != "first"
        assert res.plan is not None and batch_of(res.plan, "j") == "first"


def test_replan_parses_each_stored_plan_once(tmp_path: Path, monkeypatch) -> None:
    """A pass reads a plan once however many of its jobs it looks at (a 600-job plan
    took 0.1 s a parse, once per job row)."""
    import hetsched.app.space_replan as replan_mod

    parsed: list[str] = []
    real = replan_mod.plan_from_dict

    def counting(raw: dict[str, Any], source: str) -> Plan:
        parsed.append(str(raw.get("plan_id")))
        return real(raw, source)

    slurm = MemorySlurm(nodes_spec=(("v100-1", "v100", 4), ("v100-2", "v100", 4)))
    table = ThroughputTable([ProfileRow("mlp", "v100", b, 0.01 + 0.001 * b)
                             for b in (4, 8, 16)])
    three = _plan("three", 8000)
    body = json.loads(three.to_json())
    body["jobs"] = [dict(body["jobs"][0], name=n, spec=dict(body["jobs"][0]["spec"], name=n))
                    for n in ("j1", "j2", "j3")]
    body.pop("plan_id")
    with open_store(tmp_path / "s.db") as st:
        submit(plan_from_dict(body, "test"), st, slurm)
        slurm.schedule()
        Monitor(st, slurm).poll()
        monkeypatch.setattr(replan_mod, "plan_from_dict", counting)
        res = replan(st, slurm, table, policy="fifo", force=True)
    assert res.new_plan_id and len(parsed) == len(set(parsed)) == 1


def test_replan_of_a_mode_auto_plan_stays_in_its_mode(tmp_path: Path) -> None:
    """`--mode auto` picked space for this batch: replan plans it in space mode again (its
    jobs are space-mode Slurm jobs), whatever auto would pick now."""
    slurm = MemorySlurm(nodes_spec=(("v100-1", "v100", 4), ("v100-2", "v100", 4)))
    table = ThroughputTable([ProfileRow("mlp", "v100", b, 0.01 + 0.001 * b)
                             for b in (4, 8, 16)])
    body = json.loads(_plan("auto1", 8000).to_json())
    body["settings"] = {"mode": "auto", "policy": "jps", "params": {"samples": 5}}
    with open_store(tmp_path / "s.db") as st:
        submit(plan_from_dict(body, "test"), st, slurm)
        slurm.schedule()
        Monitor(st, slurm).poll()
        res = replan(st, slurm, table, force=True)
        assert res.plan is not None and res.plan["mode"] == "space"
        assert res.plan["settings"]["mode"] == "space"
        assert (res.plan["settings"]["policy"], res.plan["settings"]["params"]) == (
            "jps", {"samples": 5})


def test_a_logs_last_line_is_what_the_program_said(tmp_path: Path) -> None:
    """`status` and a failed probe quote the log's last line from the job's program:
    Slurm's own lines after it are skipped, control characters cannot reach the
    terminal, a long line is cut, and an unreadable log says nothing."""
    from hetsched.io.jobfiles import log_cause, log_of

    log = tmp_path / "logs" / "bad2-37.out"
    log.parent.mkdir()
    log.write_text("Traceback (most recent call last):\n  File \"t.py\", line 3\n"
                   "ValueError: no data at /d\x1b[31m\n\n"
                   "srun: error: a100-1: task 0: Exited with exit code 1\n"
                   "slurmstepd-a100-1: error: *** STEP 37.0 CANCELLED ***\n")
    assert log_of(tmp_path / "logs", "37") == log
    assert log_of(tmp_path / "logs", "3") is None and log_of(tmp_path / "logs", None) is None
    assert log_cause(log) == "ValueError: no data at /d?[31m"
    log.write_text("x" * 300 + "\n")
    assert log_cause(log, limit=20) == "x" * 20 + "..."
    assert log_cause(tmp_path / "missing.out") == ""
    log.write_text("srun: error: only Slurm spoke\n")
    assert log_cause(log) == ""
