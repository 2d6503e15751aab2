"""Progress of planning through a reporter object with named hooks.

Like resolvelib's ``BaseReporter``: the planner calls one method per kind of
event and never formats text for a terminal; the CLI subclasses it
(:mod:`hetsched.cli.progress`) and renders progress on stderr. Every hook
does nothing by default, so a reporter overrides only what it shows, and a
new hook never breaks an old reporter.
"""

from __future__ import annotations

from collections.abc import Sequence


class BaseReporter:
    """Hooks the planner calls while it plans; all do nothing here."""

    def planning_started(self, mode: str, policy: str, candidates: Sequence[str]) -> None:
        """A plan is being made; ``candidates`` are the policies that will be tried."""

    def candidate_started(self, name: str) -> None:
        """Policy ``name`` starts (one of auto's candidates, or the one policy asked for)."""

    def candidate_done(self, name: str, objective: float, seconds: float) -> None:
        """Policy ``name`` produced a plan with total weighted JCT ``objective``."""

    def candidate_skipped(self, name: str, reason: str) -> None:
        """Policy ``name`` was not run (too expensive for the budget, too large, ...)."""

    def candidate_failed(self, name: str, error: str) -> None:
        """Policy ``name`` raised; auto goes on without it."""

    def event(self, name: str, t: float, active: int, done: int, total: int) -> None:
        """Policy ``name`` reached a reset event at simulated time ``t``."""

    def note(self, message: str) -> None:
        """Anything else worth a line (e.g. a deprecated policy name)."""

    def planning_done(self, policy: str, objective: float, seconds: float) -> None:
        """The chosen plan: its policy, objective and total planning time."""


class RecordingReporter(BaseReporter):
    """Keeps every hook call as ``(hook, args)``; for tests and the Python API."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def __getattribute__(self, name: str) -> object:
        attr = object.__getattribute__(self, name)
        if name.startswith("_") or name == "calls" or not callable(attr) \
                or not hasattr(BaseReporter, name):
            return attr
        calls = object.__getattribute__(self, "calls")

        def record(*args: object) -> None:
            calls.append((name, args))

        return record

    def hooks(self, name: str) -> list[tuple[object, ...]]:
        return [a for n, a in self.calls if n == name]


NULL_REPORTER = BaseReporter()

__all__ = ["BaseReporter", "RecordingReporter", "NULL_REPORTER"]
