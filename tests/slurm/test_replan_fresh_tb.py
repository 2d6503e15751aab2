"""cron's ``replan`` on a machine where nothing was submitted yet: quiet, exit 0.

The profile history is read only when a plan is made, so an empty (or absent) history
is no error for a pass with nothing to do; a ``--throughputs`` path that does not exist
still fails at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hetsched.slurm.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]


def _replan(testbed: Testbed, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **testbed.env(), "PYTHONPATH": str(REPO),
           "HETSCHED_STATE": str(tmp_path / "s.db"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    return subprocess.run([sys.executable, "-m", "hetsched", "replan", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_nothing_submitted_is_quiet_without_profiles(testbed: Testbed, tmp_path: Path) -> None:
    res = _replan(testbed, tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    res = _replan(testbed, tmp_path, "-v")
    assert res.returncode == 0, res.stderr
    assert "no reset events" in res.stdout


def test_a_missing_profiles_file_still_fails_at_once(testbed: Testbed, tmp_path: Path) -> None:
    res = _replan(testbed, tmp_path, "--throughputs", str(tmp_path / "nope.csv"))
    assert res.returncode == 2
    assert "nope.csv" in res.stderr and "Traceback" not in res.stderr
