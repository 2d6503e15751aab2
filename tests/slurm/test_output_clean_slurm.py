"""stdout is only the document for the commands whose JSON needs a Slurm.

The twin of tests/test_output_clean.py for ``cluster``, ``replan`` and
``testbed status``: each runs in a subprocess against the testbed and its
stdout goes straight into ``json.loads``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.slurm.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args", [
    ["cluster", "--format", "json"],
    ["cluster", "--json"],
    ["replan", "--format", "json", "--throughputs", str(REPO / "examples" /
                                                       "gavel_throughputs.csv")],
    ["testbed", "status", "--format", "json"],
], ids=lambda a: " ".join(a[:3]))
def test_stdout_is_only_the_document(args: list[str], testbed: Testbed, tmp_path: Path) -> None:
    env = {**os.environ, **testbed.env(), "PYTHONPATH": str(REPO),
           "HETSCHED_STATE": str(tmp_path / "s.db"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    if args[0] == "testbed":
        args = [*args, "--dir", str(testbed.dir)]
    res = subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert isinstance(doc, dict) and doc
