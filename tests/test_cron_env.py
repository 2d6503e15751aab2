"""hetsched run from cron: a bare PATH, and the scripts it writes still find hetsched.

cron runs `hetsched replan` with PATH=/usr/bin:/bin, and a batch job gets the
submitter's environment, PATH included. The job scripts named `hetsched` by
what PATH found, which there is nothing: they said a bare `hetsched`, and the
compute node's shell found no such command. They now name the hetsched that
is running (or the console script beside its Python), by absolute path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses: `make test`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
CONSOLE = Path(sys.executable).parent / "hetsched"


@pytest.mark.skipif(not CONSOLE.is_file(), reason="the hetsched console script is not "
                    "installed beside this Python")
@pytest.mark.parametrize("how", ["console", "module"])
def test_scripts_name_the_running_hetsched_under_crons_path(tmp_path: Path, how: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C",
           "HETSCHED_STATE": str(tmp_path / "s.db"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    plan = tmp_path / "plan.json"
    subprocess.run([sys.executable, "-m", "hetsched", "plan", str(EX / "jobs.yaml"),
                    "--cluster", str(EX / "cluster.yaml"), "--throughputs",
                    str(EX / "gavel_throughputs.csv"), "--policy", "fifo", "--no-gantt",
                    "--out", str(plan)], check=True, capture_output=True, env=env,
                   timeout=300)
    cmd = [str(CONSOLE)] if how == "console" else [sys.executable, "-m", "hetsched"]
    res = subprocess.run([*cmd, "submit", str(plan), "--dry-run"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    exes = set(re.findall(r"^srun .*?(\S+) run --plan", res.stdout, re.MULTILINE))
    assert exes == {str(CONSOLE)}, exes
    assert os.access(str(CONSOLE), os.X_OK)
