"""How a local rank ends: its exit code, its traceback, its exit hooks, no teardown.

``run --local`` starts each rank with ``spawn_local``; a rank ends through
``os._exit`` after running Python's exit hooks, so torch's C++ teardown cannot
abort a rank that has finished (runtime/launcher.py).
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest

from hetsched.errors import InputError
from hetsched.runtime.launcher import spawn_local


def _writes_at_exit(out: str) -> None:
    rank = os.environ["RANK"]
    atexit.register(lambda: Path(out, f"hook{rank}").write_text("ran"))
    print(f"rank {rank} printed", flush=False)  # unflushed: the exit flushes it


def _fails(kind: str) -> None:
    if kind == "value":
        raise ValueError("a bug in the rank")
    if kind == "input":
        raise InputError("jobs.yaml", "rank's input is bad")
    sys.exit(3)


def _rank1_fails() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("only rank 1")


def test_a_finished_rank_runs_its_exit_hooks_and_exits_zero(tmp_path: Path,
                                                            capfd: pytest.CaptureFixture[str]
                                                            ) -> None:
    assert spawn_local(2, _writes_at_exit, (str(tmp_path),), timeout_s=120) == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook0", "hook1"]
    out = capfd.readouterr().out
    assert "rank 0 printed" in out and "rank 1 printed" in out


@pytest.mark.parametrize(("kind", "code", "said"), [
    ("value", 1, "ValueError: a bug in the rank"),
    ("input", 2, "hetsched: error: rank 0: jobs.yaml: rank's input is bad"),
    ("exit", 3, ""),
])
def test_a_failed_rank_says_why_and_exits_with_its_code(kind: str, code: int, said: str,
                                                        capfd: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert spawn_local(1, _fails, (kind,), timeout_s=120) == [code]
    assert said in capfd.readouterr().err


def test_one_failed_rank_stops_the_other() -> None:
    codes = spawn_local(2, _rank1_fails, (), timeout_s=120)
    assert codes[1] == 1 and codes[0] in (0, -15, -9)
