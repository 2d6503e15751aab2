"""`make gpu-check` runs on CPU too: every check but the probe's (a minute of timing)
runs here as a user runs it, a subprocess printing JSON, and none may fail.

No timings are asserted (speed is the script's own business on a GPU): this test
fails when a check breaks against the runtime's interfaces, which on a lent GPU
would cost the one run a session gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # multi-process torch: `make test`, not `make test-fast`

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_cpu() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu",
                        "--only", "switch,zeroing,pool,group", "--json"],
                       capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    rows = out["rows"]
    failed = [row for row in rows if row[3] == "FAILED"]
    assert not failed, f"{failed}\n{r.stderr[-3000:]}"
    checks = [row[0] for row in rows]
    for want in ("switch: resnet50, residency", "  split: resnet50, residency",
                 "  host update: resnet50", "zeroing after a ResNet-50 task",
                 "pool plan of the built-ins: weighted JCT",
                 "co-location: parameters vs each job alone (deterministic kernels)"):
        assert want in checks, checks
    # the co-location group trains each job as it trains alone, bit for bit on a CPU
    colo = next(row for row in rows if row[0].startswith("co-location: parameters"))
    assert colo[1] == "max |difference| 0", colo
    # each row was also streamed to stderr as it was measured (a time limit keeps them)
    assert sum(line.startswith("row: ") for line in r.stderr.splitlines()) == len(rows)


def _running(mark: str) -> list[int]:
    """Pids of processes whose environment holds ``mark`` (every process the run started)."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if mark.encode() in env:
            out.append(int(d.name))
    return out


def test_a_check_past_its_time_limit_is_cut_off_and_leaves_nothing_running() -> None:
    """A check that overruns costs its own limit only: its process group is killed (the
    check's process and the ranks it spawned), the table says so, and the next check runs."""
    mark = f"GPU_CHECK_TEST_{uuid.uuid4().hex}"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu",
                        "--only", "group,zeroing", "--limit-s", "3", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1", mark: "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)["rows"]
    assert rows[0] == ["group", "cut off at its time limit (3 s), 0 rows before", "",
                       "unmeasured"], rows
    assert rows[1][0] == "zeroing after a ResNet-50 task"  # the next check ran
    assert not _running(mark)
