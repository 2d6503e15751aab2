"""A command imports only what it runs: ``--help`` and shell completion load no numpy,
scipy, pydantic, torch, solvers or matplotlib (each TAB would otherwise pay seconds).

Each case runs the real entry point in a fresh interpreter and reads back which modules
it loaded; no timing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HEAVY = ("scipy", "pydantic", "numpy", "torch", "pulp", "highspy", "matplotlib")

# the CLI as the `hetsched` script runs it; at exit, the heavy modules it loaded
SCRIPT = (
    "import atexit, sys\n"
    f"HEAVY = {HEAVY!r}\n"
    "atexit.register(lambda: sys.stderr.write("
    "'LOADED:' + ','.join(m for m in HEAVY if m in sys.modules) + '\\n'))\n"
    "from hetsched.cli.main import main\n"
    "sys.argv[0] = 'hetsched'\n"
    "main()\n"
)


def _loaded(args: list[str], env: dict[str, str] | None = None) -> tuple[list[str], str]:
    res = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True,
                         text=True, env={**os.environ, **(env or {})}, timeout=120)
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("LOADED:")]
    assert line, res.stderr
    loaded = line[-1].removeprefix("LOADED:")
    return [m for m in loaded.split(",") if m], res.stdout


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["exec", "--help"],
                                  ["probe", "--help"], ["submit", "--help"],
                                  ["replan", "--help"], ["status", "--help"],
                                  ["plan", "--help"], ["simulate", "--help"]])
def test_help_loads_no_heavy_module(args: list[str]) -> None:
    loaded, out = _loaded(args)
    assert "Usage: hetsched" in out
    assert loaded == []


def test_completion_loads_no_heavy_module() -> None:
    loaded, out = _loaded([], {"_HETSCHED_COMPLETE": "bash_complete",
                               "COMP_WORDS": "hetsched pl", "COMP_CWORD": "1"})
    assert "plain,plan" in out.split()  # bash_complete answers type,value lines
    assert loaded == []


def test_the_probe_sees_a_heavy_import() -> None:
    """The check itself works: a command that plans does load numpy."""
    loaded, _ = _loaded(["policies", "--json"])
    assert "numpy" in loaded
