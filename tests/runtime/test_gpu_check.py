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
