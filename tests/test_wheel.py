"""A wheel, installed in a fresh virtual environment, works from any directory.

Built with ``python -m build`` like a release; installed with ``--no-deps``
into a venv that borrows the already installed dependencies
(``--system-site-packages``), and run from a directory outside the checkout,
so only what the wheel carries (templates and plugins as package data
included) can be used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    d = tmp_path_factory.mktemp("wheel")
    src = d / "src"  # a clean copy: no egg-info or build leftovers from the checkout
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard"],
                           check=True, capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        p = REPO / f
        if p.is_symlink() or p.is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            if p.is_symlink():
                os.symlink(os.readlink(p), src / f)
            else:
                shutil.copy2(p, src / f)
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                        "--outdir", str(d / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = (d / "dist").glob("hetsched-*.whl")
    env_dir = d / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)],
                   check=True, timeout=120)
    subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    return env_dir


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETSCHED_", "PYTHON"))}
    env.update(HOME=str(cwd), XDG_STATE_HOME=str(cwd / "state"))
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    return subprocess.run([str(venv / "bin" / "hetsched"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_wheel_carries_templates_and_plugins(venv: Path, tmp_path: Path) -> None:
    py = venv / "bin" / "python"
    out = subprocess.run([str(py), "-c", "import hetsched, hetsched.slurm.templates as t; "
                          "print(hetsched.__file__); print(t.templates_dir()); "
                          "print(sorted(p.name for p in t.package_data('plugins').iterdir()))"],
                         cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    mod, tdir, plugins = out.splitlines()
    assert mod.startswith(str(venv)), mod  # the wheel's copy, not the checkout
    assert Path(tdir, "hetjob.sbatch.j2").is_file() and not Path(tdir).is_symlink()
    assert "job_submit.lua" in plugins and "spank_hetsched.c" in plugins


def test_wheel_plans_and_submits_dry_run_elsewhere(venv: Path, tmp_path: Path,
                                                   examples: dict[str, Path]) -> None:
    r = _run(venv, tmp_path, "plan", str(examples["jobs"]), "--cluster",
             str(examples["cluster"]), "--throughputs", str(examples["throughputs"]),
             "--out", "plan.json", "--format", "json")
    assert r.returncode == 0, r.stderr
    r = _run(venv, tmp_path, "submit", "plan.json", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("#!/bin/bash") == 6 and "#SBATCH --gres=gpu:" in r.stdout


@pytest.mark.slurm
def test_wheel_starts_the_testbed_elsewhere(venv: Path, tmp_path: Path) -> None:
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    tb = tmp_path / "tb"
    try:
        r = _run(venv, tmp_path, "testbed", "up", "--dir", str(tb), "--lua")
        assert r.returncode == 0, r.stdout + r.stderr
        assert (tb / "etc" / "job_submit.lua").is_file()  # the plugin came from the wheel
    finally:
        _run(venv, tmp_path, "testbed", "down", "--dir", str(tb))
