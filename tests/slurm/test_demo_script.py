"""`make demo`'s second half, examples/demo-testbed.sh, run by bash as `make demo` runs it:
with no Slurm site answering it brings up its own test cluster, takes the bundled testbed
example to its end and takes everything down; where a site answers it leaves it alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.slurm.testbed import Testbed

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "demo-testbed.sh"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This tree's hetsched first on PATH; no Slurm or hetsched variables of the session."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "hetsched").write_text(f"#!/bin/sh\nexec {sys.executable} -m hetsched \"$@\"\n")
    (shim / "hetsched").chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "HETSCHED", "SBATCH"))}
    return {**env, "PATH": f"{shim}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), **extra}


def test_the_demo_runs_the_example_on_its_own_test_cluster(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                       env=_env(tmp_path, HETSCHED_DEMO_WAIT_S="240"), timeout=600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr
    last = r.stdout[r.stdout.rindex("hetsched jobs"):]
    for job in ("mlp-small", "cnn-small", "transformer-small"):  # its row, not a "!" note
        assert any(job in ln and "COMPLETED" in ln for ln in last.splitlines()), last
    assert "demo: done" in r.stdout
    # down and gone: no daemon of its cluster, no directory left
    assert not list(tmp_path.glob("hetsched-demo.*"))
    ps = subprocess.run(["pgrep", "-af", "hetsched-demo"], capture_output=True, text=True)
    assert "slurm" not in ps.stdout, ps.stdout


def test_a_site_that_answers_is_left_alone(testbed: Testbed, tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True,
                       env=_env(tmp_path, SLURM_CONF=str(testbed.conf)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "a Slurm site answers here" in r.stdout
    assert not list(tmp_path.glob("hetsched-demo.*"))
