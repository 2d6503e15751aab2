"""Global -v/-vv/-q: Python logging on stderr, stdout untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HETSCHED_STATE": str(tmp_path / "s.db"),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg"), "SLURM_CONF": str(tmp_path / "none.conf")}
    return subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)


def test_vv_shows_every_slurm_command_on_stderr(tmp_path: Path, monkeypatch) -> None:
    # a stand-in sinfo that fails at once: -vv has already said what hetsched ran
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: invalid partition' >&2\n"
                                   "exit 1\n")
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    res = run(["-vv", "cluster", "-p", "gpu"], tmp_path)
    plain = run(["cluster", "-p", "gpu"], tmp_path)
    assert res.returncode != 0
    assert "hetsched: debug: run: sinfo --json" in res.stderr
    assert res.stdout == ""
    assert "debug" not in plain.stderr and plain.stderr.startswith("hetsched: error:")


def test_quiet_drops_warnings_but_not_the_result(tmp_path: Path) -> None:
    # a cluster with a GPU type the profiles do not cover: plan warns about it
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text((EX / "cluster.yaml").read_text() + "  - {names: x1, gpu_type: h200, "
                       "gpus: 2}\n")
    args = ["plan", str(EX / "jobs.yaml"), "--cluster", str(cluster), "--throughputs",
            str(EX / "gavel_throughputs.csv"), "--no-gantt", "--policy", "fifo"]
    loud = run(args, tmp_path)
    assert loud.returncode == 0, loud.stderr
    assert "hetsched: warning:" in loud.stderr and "h200" in loud.stderr
    quiet = run(["-q", *args], tmp_path)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
    # the same plan on stdout (its table; the planning time line differs run to run)
    same = [ln for ln in loud.stdout.splitlines() if "planning time" not in ln]
    assert [ln for ln in quiet.stdout.splitlines() if "planning time" not in ln] == same
