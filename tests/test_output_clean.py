"""stdout carries only the document for every command with a machine-readable format.

Each command runs as a user runs it, in a subprocess with stdout piped into
``json.loads`` / ``yaml.safe_load``; progress, notes and solver logs (the
HiGHS banner pool mode's LP used to print) go to stderr or nowhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
PLAN = ["plan", str(EX / "jobs.yaml"), "--cluster", str(EX / "cluster.yaml"),
        "--throughputs", str(EX / "gavel_throughputs.csv"), "--no-gantt"]


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HETSCHED_STATE": str(tmp_path / "s.db"),
           "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    code = "import sys; from hetsched.cli.main import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)


CASES = [
    (PLAN + ["--format", "json"], "json"),
    (PLAN + ["--format", "yaml"], "yaml"),
    (PLAN + ["--policy", "jps", "--param", "samples=8", "--format", "json"], "json"),
    (PLAN + ["--mode", "pool", "--format", "json"], "json"),
    (PLAN + ["--mode", "pool", "--policy", "hare", "--format", "yaml"], "yaml"),
    (PLAN + ["--mode", "pool", "--policy", "fifo", "--format", "json"], "json"),  # a note
    (["policies", "--format", "json"], "json"),
    (["config", "show", "--format", "json"], "json"),
    (["status", "--format", "json"], "json"),  # no state file yet: an empty batch
    (["profiles", "list", "--format", "json"], "json"),
    (["simulate", str(EX / "jobs.yaml"), "--cluster", str(EX / "cluster.yaml"),
      "--throughputs", str(EX / "gavel_throughputs.csv"), "--policy", "fifo", "--offline",
      "none", "--format", "json"], "json"),
]
#: commands whose JSON needs a Slurm: their clean stdout is asserted on the testbed
NEEDS_SLURM = {("profile",): "tests/slurm/test_e2e_runtime.py (json.loads of profile's stdout)",
               ("cluster",): "tests/slurm/test_output_clean_slurm.py",
               ("replan",): "tests/slurm/test_output_clean_slurm.py",
               ("testbed", "status"): "tests/slurm/test_output_clean_slurm.py"}


@pytest.mark.parametrize(("args", "fmt"), CASES, ids=[" ".join(a[-4:]) for a, _ in CASES])
def test_stdout_is_only_the_document(args: list[str], fmt: str, tmp_path: Path) -> None:
    res = run(args, tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout) if fmt == "json" else yaml.safe_load(res.stdout)
    assert isinstance(doc, (dict, list))  # an empty listing is a document too
    assert "HiGHS" not in res.stdout
    if args[0] == "plan":
        assert doc["objective"]["weighted_jct_s"] > 0
        assert "Running HiGHS" not in res.stderr  # the solver is silent, not just moved


def test_every_format_option_is_covered() -> None:
    """A new command with --format json|yaml must be added to CASES above."""
    import click

    from hetsched.cli.main import main

    def walk(cmd: click.Command, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        out = []
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                out += walk(sub, (*path, name))
        for p in cmd.params:
            if isinstance(p, click.Option) and "--format" in p.opts and isinstance(
                    p.type, click.Choice) and {"json", "yaml"} & set(p.type.choices):
                out.append(path)
        return out

    covered = {tuple(a[: 2 if a[0] in ("config", "profiles") else 1]) for a, _ in CASES}
    assert set(walk(main, ())) <= covered | set(NEEDS_SLURM)


@pytest.mark.parametrize("flag", ["-q", "-vv", "--quiet"])
def test_a_main_option_after_the_command_says_where_it_goes(flag: str, tmp_path: Path) -> None:
    """`hetsched plan ... -q` is a usage error (exit 2) whose line says to put the option
    before the command; an option of the command itself (`submit --qos`'s -q, replan's
    -v) is untouched, and an unknown option keeps click's own hint."""
    res = run([*PLAN, flag], tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    opt = "-v" if flag == "-vv" else flag
    assert f"put it before the command: hetsched {opt} plan ..." in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    ok = run(["-q", *PLAN], tmp_path)
    assert ok.returncode == 0, ok.stderr
    res = run([*PLAN, "--bogus"], tmp_path)
    assert res.returncode == 2 and "before the command" not in res.stderr
