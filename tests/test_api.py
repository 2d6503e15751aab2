"""The Python API: docs/api.md's example runs as written, from the repository root."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_docs_example_runs() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("auto:") and "lower bound" in lines[0]
    assert len([x for x in lines if "JCT" in x and "start" in x]) == 6
    assert "6 sbatch scripts rendered" in r.stdout
    assert lines[-1].startswith("refused: policy: unknown policy 'no-such-policy'; valid: ")


def test_import_is_lazy() -> None:
    code = "import sys, hetsched; print(sorted(m for m in sys.modules if m.startswith('hetsched')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['hetsched']"
