"""Node records from Slurm 23.11 on, where `sinfo --json` no longer lists nodes.

From 23.11 (data_parser v0.0.40) `sinfo --json` dumps sinfo's own report: a
``sinfo`` list of node *groups* (a group's state, GRES and GRES in use, its
partition), no ``nodes`` list. hetsched read the nodes from it, so on those
versions every command that needs the partition failed with "sinfo --json:
no 'nodes' list in the output". The node records are now read from `scontrol
show nodes --json` there: the same fields as 22.05's `sinfo --json`.

No Slurm of 23.11 or later runs here (the testbed is Debian's 22.05), so
stand-in `sinfo` and `scontrol` print documents of that layout; the user's
command (`hetsched cluster`) runs as a subprocess against them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import Runner

META = {"plugin": {"type": "", "name": "", "data_parser": "data_parser/v0.0.41"},
        "slurm": {"version": {"major": "24", "micro": "4", "minor": "05"},
                  "release": "24.05.4", "cluster": "c"}}
SINFO = {"sinfo": [
    {"port": 6818, "node": {"state": ["MIXED"]},
     "nodes": {"allocated": 1, "idle": 0, "other": 0, "total": 1, "hostnames": [],
               "addresses": [], "nodes": ["gpu-a-01"]},
     "cpus": {"allocated": 8, "idle": 56, "other": 0, "total": 64},
     "gres": {"total": "gpu:A100:4(S:0-1)", "used": "gpu:A100:1(IDX:0)"},
     "partition": {"name": "gpu", "maximums": {"time": {"set": True, "infinite": True,
                                                         "number": 0}}}},
    {"port": 6818, "node": {"state": ["IDLE", "DRAIN"]},
     "nodes": {"allocated": 0, "idle": 1, "other": 0, "total": 1, "hostnames": [],
               "addresses": [], "nodes": ["gpu-v-01"]},
     "cpus": {"allocated": 0, "idle": 32, "other": 0, "total": 32},
     "gres": {"total": "gpu:Tesla_V100:2", "used": "gpu:Tesla_V100:0(IDX:N/A)"},
     "partition": {"name": "gpu"}}], "meta": META, "errors": [], "warnings": []}
NODES = {"nodes": [
    {"name": "gpu-a-01", "hostname": "gpu-a-01", "state": ["MIXED"],
     "gres": "gpu:A100:4(S:0-1)", "gres_used": "gpu:A100:1(IDX:0)", "partitions": ["gpu"],
     "cpus": 64, "alloc_cpus": 8, "reason": "",
     "reason_changed_at": {"set": True, "infinite": False, "number": 0}},
    {"name": "gpu-v-01", "hostname": "gpu-v-01", "state": ["IDLE", "DRAIN"],
     "gres": "gpu:Tesla_V100:2", "gres_used": "gpu:Tesla_V100:0(IDX:N/A)",
     "partitions": ["gpu", "debug"], "cpus": 32, "alloc_cpus": 0, "reason": "bad fan"},
    {"name": "cpu-01", "hostname": "cpu-01", "state": ["IDLE"], "gres": "",
     "gres_used": "", "partitions": ["cpu"], "cpus": 128, "reason": ""}],
    "meta": META, "errors": [], "warnings": []}


@pytest.fixture()
def slurm_24(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand-in `sinfo` and `scontrol` printing Slurm 24.05's JSON (and logging each call)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for name, doc in (("sinfo", SINFO), ("scontrol", NODES)):
        data = tmp_path / f"{name}.json"
        data.write_text(json.dumps(doc))
        (bin_dir / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> {log}\n"
                                    f"exec cat {data}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_nodes_come_from_scontrol_where_sinfo_lists_groups(slurm_24: Path) -> None:
    nodes = CliSlurmClient(Runner(retries=0)).nodes("gpu")
    assert slurm_24.read_text().splitlines() == ["sinfo --json", "scontrol show nodes --json"]
    by = {n.name: n for n in nodes}
    assert set(by) == {"gpu-a-01", "gpu-v-01"}  # the cpu partition's node left out
    assert by["gpu-a-01"].state == "mixed" and by["gpu-a-01"].free_gpus == {"a100": 3}
    assert by["gpu-v-01"].state == "drained" and by["gpu-v-01"].reason == "bad fan"
    assert by["gpu-v-01"].gres_names == {"tesla_v100": "Tesla_V100"}


def test_cluster_command_on_slurm_24(slurm_24: Path, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "hetsched", "cluster", "-p", "gpu",
                          "--json"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HETSCHED_STATE": str(tmp_path / "s.db")})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["free_gpus"] == {"gpu-a-01": 3, "gpu-v-01": 0}
    assert {r["gpu_type"]: r["usable"] for r in out["by_type"]} == {"a100": 4,
                                                                    "tesla_v100": 0}


def test_a_24_05_job_record_reads_like_a_22_05_one() -> None:
    from hetsched.slurm.client import parse_job_json

    def num(n: int | None) -> dict[str, object]:
        return {"set": n is not None, "infinite": False, "number": n or 0}

    j = parse_job_json({
        "job_id": 812, "name": "m1", "job_state": ["PENDING"], "state_reason": "Dependency",
        "state_description": "", "nodes": "", "partition": "gpu",
        "comment": "hetsched:abc:m1:0", "admin_comment": "", "het_job_id": num(811),
        "het_job_offset": num(1), "exit_code": {"status": ["PENDING"],
                                                "return_code": num(None), "signal": {}},
        "tres_per_node": "gres/gpu:1", "restart_cnt": 2, "start_time": num(1700000000),
        "end_time": num(None), "dependency": "afterany:810(unfulfilled)",
        "time_limit": num(30), "required_nodes": "gpu-a-01"})
    assert (j.job_id, j.state, j.reason, j.comment, j.leader, j.het_offset) == (
        "812", "PENDING", "Dependency", "hetsched:abc:m1:0", "811", 1)
    assert (j.restarts, j.start_time, j.end_time, j.time_limit_min, j.exit_code) == (
        2, 1700000000, 0, 30, None)
    assert j.dependency == "afterany:810(unfulfilled)" and j.required_nodes == "gpu-a-01"


def test_a_jobs_cores_per_gpu_come_from_cpus_per_tres() -> None:
    """22.05 gives a job that asked no --cpus-per-task the partition's DefCpuPerGPU as
    ``cpus_per_tres`` (seen on the testbed: "gpu:2"); an in-place replan keeps it."""
    from hetsched.slurm.client import parse_job_json

    assert parse_job_json({"job_id": 7, "cpus_per_tres": "gpu:2",
                           "cpus_per_task": None}).cpus_per_gpu == 2
    assert parse_job_json({"job_id": 7, "cpus_per_tres": "gres/gpu:8"}).cpus_per_gpu == 8
    assert parse_job_json({"job_id": 7, "cpus_per_tres": ""}).cpus_per_gpu is None
