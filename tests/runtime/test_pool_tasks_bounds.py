"""A pool plan's ``tasks`` section is checked and bounded at load: one line, exit 2, in
``hetsched exec`` and ``hetsched submit --dry-run`` alike (never a MemoryError, a
ValueError or a KeyError traceback)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.exec_helpers import MAIN, env, make_plan


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bounds")
    return dict(json.loads(make_plan(tmp, gpus=2, task_iterations=1).read_text()))


def _set_repeat(p: dict[str, Any]) -> None:
    p["tasks"]["gpus"][0]["runs"][0]["repeat"] = 10**12


def _string_tpr(p: dict[str, Any]) -> None:
    next(iter(p["tasks"]["jobs"].values()))["tasks_per_round"] = "3"


def _no_gpus(p: dict[str, Any]) -> None:
    del p["tasks"]["gpus"]


def _unknown_job(p: dict[str, Any]) -> None:
    p["tasks"]["gpus"][0]["runs"][0]["tasks"][0][0] = "ghost"


def _round_beyond(p: dict[str, Any]) -> None:
    p["tasks"]["gpus"][0]["runs"][0]["tasks"][0][1] = 10**6


def _short_row(p: dict[str, Any]) -> None:
    p["tasks"]["gpus"][0]["runs"][0]["tasks"][0] = ["a", 0]


CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("repeat 10**12", _set_repeat, "repeat: must be <= 1e+07"),
    ("string tasks_per_round", _string_tpr, "tasks_per_round: expected a number"),
    ("no gpus", _no_gpus, "tasks.gpus: expected a list"),
    ("unknown job", _unknown_job, "task of unknown job 'ghost'"),
    ("round beyond the job's", _round_beyond, "this row is round 1000000"),
    ("short row", _short_row, "a task row is a list of 8 values"),
]


@pytest.mark.parametrize("name,mutate,says", CASES, ids=[c[0] for c in CASES])
def test_bad_tasks_section_is_one_line_in_exec_and_dry_run(
        tmp_path: Path, good: dict[str, Any], name: str,
        mutate: Callable[[dict[str, Any]], None], says: str) -> None:
    plan = copy.deepcopy(good)
    mutate(plan)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(plan))
    for args in (["exec", "--plan", str(path), "--local"],
                 ["submit", str(path), "--dry-run", "--state", str(tmp_path / "s.db")]):
        r = subprocess.run([sys.executable, "-c", MAIN, *args], env=env(), capture_output=True,
                           text=True, timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2, (args[0], r.stderr)
        assert len(lines) == 1 and says in lines[0] and str(path) in lines[0], (args[0],
                                                                                 r.stderr)
