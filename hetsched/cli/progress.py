"""Planning progress on stderr: a reporter (hetsched.core.report) rendered with rich.

On a terminal: a live progress bar per candidate policy (reset events
simulated out of the jobs' arrivals and completions) and one line per
result. Not on a terminal (a pipe, a file, CI): nothing but skipped and
failed candidates and deprecation notes, one plain line each. stdout is
never written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from hetsched.core.report import BaseReporter


class JobsColumn(ProgressColumn):
    """``done/total jobs``; ``done jobs`` while the total is not known yet.

    A candidate's task starts with ``total=None`` (rich's indeterminate bar)
    until its first event gives the job count, so the column must render a
    task without a total.
    """

    def render(self, task: Task) -> Text:
        done = f"{task.completed:>6.0f}"
        if task.total is None:
            return Text(f"{done} jobs")
        return Text(f"{done}/{task.total:.0f} jobs")


class RichReporter(BaseReporter):
    """Renders planning hooks on ``console`` (stderr); live bars only on a terminal."""

    def __init__(self, console: Console | None = None, live: bool | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal if live is None else live
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

    # -- lifecycle ---------------------------------------------------------
    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self.progress is not None:
            progress, self.progress = self.progress, None
            try:
                progress.stop()
            except OSError:  # the terminal is gone (a hangup: EIO): nothing to take down
                pass

    def _bar(self) -> Progress:
        if self.progress is None:
            self.progress = Progress(TextColumn("{task.description:<12}"), BarColumn(),
                                     JobsColumn(),
                                     TimeElapsedColumn(), console=self.console, transient=True)
            self.progress.start()
        return self.progress

    def line(self, text: str) -> None:
        """One line on stderr (above the bars when they are live)."""
        self._line(text)

    def _line(self, text: str) -> None:
        try:
            if self.progress is not None:
                self.progress.console.print(text, highlight=False)
            else:  # piped: one line stays one line, however long (no wrapping at 80 columns)
                self.console.print(text, highlight=False, soft_wrap=not self.console.is_terminal)
        except OSError:  # the terminal is gone (a hangup: EIO); the work goes on unsaid
            pass

    # -- hooks -------------------------------------------------------------
    def probes(self, pending: int, running: int, done: int, total: int) -> None:
        if not self.live:
            return
        bar = self._bar()
        label = f"probes ({running} running, {pending} queued)"
        if "probes" not in self.tasks:
            self.tasks["probes"] = bar.add_task(label, total=total)
        bar.update(self.tasks["probes"], completed=done, description=label)

    def planning_started(self, mode: str, policy: str, candidates: Sequence[str]) -> None:
        if self.live and policy == "auto":
            self._line(f"[dim]{mode} auto: {', '.join(candidates)}[/dim]")

    def candidate_started(self, name: str) -> None:
        if self.live:
            self.tasks[name] = self._bar().add_task(name, total=None)

    def event(self, name: str, t: float, active: int, done: int, total: int) -> None:
        task = self.tasks.get(name)
        if task is not None and self.progress is not None:
            self.progress.update(task, completed=done, total=total)

    def _end(self, name: str) -> None:
        task = self.tasks.pop(name, None)
        if task is not None and self.progress is not None:
            self.progress.remove_task(task)

    def candidate_done(self, name: str, objective: float, seconds: float) -> None:
        self._end(name)
        if self.live:
            self._line(f"[dim]{name}: weighted JCT {objective:,.1f} s ({seconds:.2f} s)[/dim]")

    def candidate_skipped(self, name: str, reason: str) -> None:
        self._line(f"[yellow]{name}: skipped[/yellow] ({reason})")

    def candidate_failed(self, name: str, error: str) -> None:
        self._end(name)
        self._line(f"[red]{name}: failed[/red] ({error}); auto goes on without it")

    def note(self, message: str) -> None:
        self._line(f"[yellow]note:[/yellow] {message}")

    def planning_done(self, policy: str, objective: float, seconds: float) -> None:
        self.close()


__all__ = ["RichReporter"]
