"""The import-layers contract (pyproject's [tool.importlinter]) holds, and can fail.

docs/architecture.md draws the layers; ``lint-imports`` checks that imports
only point down. The second test proves the check is live: a copy of the
package with one import that points up (the runtime importing the Slurm
adapter) breaks the contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINT = shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is not installed")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_layers_contract_is_kept() -> None:
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout


def test_an_upward_import_breaks_it(tmp_path: Path) -> None:
    shutil.copytree(REPO / "hetsched", tmp_path / "hetsched", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "hetsched" / "runtime" / "hetdp.py"
    bad.write_text(bad.read_text() + "\nimport hetsched.slurm.client  # noqa\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "hetsched.runtime is not allowed to import hetsched.slurm" in r.stdout
    assert "hetsched.runtime.hetdp -> hetsched.slurm.client" in r.stdout


def test_a_mode_importing_another_breaks_independence(tmp_path: Path) -> None:
    """Sharing modes are adapters chosen in app/modes.py: space's submit importing pool's
    breaks the independence contract."""
    shutil.copytree(REPO / "hetsched", tmp_path / "hetsched", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bad = tmp_path / "hetsched" / "app" / "space_submit.py"
    bad.write_text(bad.read_text() + "\nimport hetsched.app.pool_submit  # noqa\n")
    r = _lint(tmp_path)
    assert r.returncode != 0
    assert "BROKEN" in r.stdout and "hetsched.app.space_submit" in r.stdout


def test_no_import_cycle_in_app() -> None:
    """No two use-case modules import each other, directly or through others."""
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("hetsched")
    mods = sorted(m for m in g.modules if m.startswith("hetsched.app."))
    cycles = [(a, b) for i, a in enumerate(mods) for b in mods[i + 1:]
              if g.chain_exists(a, b) and g.chain_exists(b, a)]
    assert cycles == []
