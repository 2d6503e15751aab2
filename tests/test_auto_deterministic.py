"""auto gives the same plan whatever the machine's load: its budget is counted work."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from test_planning_framework import four_type_instance

from hetsched.core.report import RecordingReporter
from hetsched.planning.planner import plan_problem

#: binding on this instance: has is predicted over what is left, the cheaper ones fit
BUDGET_S = 0.08


def _plan(workers: int) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    rep = RecordingReporter()
    plan = plan_problem(four_type_instance(), "auto", budget_s=BUDGET_S, workers=workers,
                        reporter=rep)
    body = plan.to_dict()
    body.pop("planning_time_s", None)
    body.pop("plan_id", None)
    return body, sorted(rep.hooks("candidate_skipped"))


def _burner() -> subprocess.Popen[bytes]:
    """Processes spinning on every core, started before and ended after the second plan."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_auto_is_the_same_plan_beside_a_cpu_burning_process() -> None:
    quiet, quiet_skipped = _plan(workers=1)
    assert quiet_skipped and "has" in dict(quiet_skipped)  # the budget binds here
    assert "counted work" in dict(quiet_skipped)["has"]
    burners = [_burner() for _ in range(2)]
    try:
        busy, busy_skipped = _plan(workers=1)
        busy2, _ = _plan(workers=2)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert busy == quiet and busy_skipped == quiet_skipped
    assert busy2["candidates"] == quiet["candidates"]
    assert busy2["policy"] == quiet["policy"]
