"""Consoles and tables of every command: widths (a terminal's, or none when piped), the
table that folds its columns to fit, and ``hetsched status``'s table."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

#: the width of a console that is not a terminal: no line is ever wrapped or cut
UNLIMITED = 100_000


def stdout_console() -> Console:
    """The console of a command's result on stdout.

    On a terminal: its width, and tables fold their columns to fit it. Piped
    or redirected: no width at all, so a table is as wide as its content, a
    long line stays one line and no name is cut (``$COLUMNS`` is ignored: a
    pipe has no width). Markup and highlighting stay on only on a terminal.
    """
    import sys

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(width=UNLIMITED, highlight=False, soft_wrap=True)


def stderr_console() -> Console:
    """Notes and progress on stderr; piped, lines are never wrapped (see stdout_console)."""
    import sys

    if sys.stderr.isatty():
        return Console(stderr=True, highlight=False)
    return Console(stderr=True, width=UNLIMITED, highlight=False, soft_wrap=True)


def print_table(console: Console, table: Any) -> None:
    """Print a renderable; piped, each line without the padding rich adds to the right."""
    if console.is_terminal or console.width < UNLIMITED:
        console.print(table)
        return
    with console.capture() as cap:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))


def folding_table(title: str | None, columns: list[tuple[str, str, str]],
                  rows: list[tuple[str, ...]], width: int = UNLIMITED, **kw: Any) -> Table:
    """A table that fits WIDTH columns by folding lists first, numbers next, names last.

    ``columns`` are (header, justify, kind) with kind ``name`` (a job's
    name: split only when nothing else can give way), ``number`` (short
    values kept whole while they fit) or ``list`` (folds first, to 10
    columns at least). Piped (WIDTH unlimited) every column has its natural
    width. Values are never cut: a column too narrow folds.
    """
    narrow = width < 110
    style = {"box": box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD,
             "padding": (0, 0) if narrow else (0, 1), "show_edge": not narrow,
             "header_style": "bold", **kw}

    def natural(i: int) -> int:
        cells = [len(line) for r in rows for line in str(r[i]).splitlines() or [""]]
        return max([*cells, *(len(w) for w in columns[i][0].split())])

    nat = [natural(i) for i in range(len(columns))]
    whole_names, whole_numbers = True, True
    for whole_names, whole_numbers in ((True, True), (False, True), (False, False)):
        mins = [nat[i] if (kind == "name" and whole_names) or (kind == "number" and whole_numbers)
                else min(nat[i], 10 if kind == "list" else 12) for i, (_, _, kind)
                in enumerate(columns)]
        probe = Table(title=title, **style)
        for h, _, _ in columns:
            probe.add_column(h)
        extra = probe._extra_width + sum(probe._get_padding_width(i) for i in range(len(columns)))
        if extra + sum(mins) <= width:
            break
    tab = Table(title=title, **style)
    for i, (h, just, kind) in enumerate(columns):
        keep = (kind == "name" and whole_names) or (kind == "number" and whole_numbers)
        tab.add_column(h, justify=just, overflow="fold",  # type: ignore[arg-type]
                       no_wrap=keep, min_width=nat[i] if keep else None)
    for r in rows:
        tab.add_row(*r)
    return tab


def fmt_s(x: float) -> str:
    """Seconds as a compact human duration: 59.3s, 12m03s, 4h05m, 2d03h."""
    if x != x:  # nan
        return "-"
    x = float(x)
    if x < 60:
        return f"{x:.1f}s"
    if x < 3600:
        return f"{int(x // 60)}m{int(x % 60):02d}s"
    if x < 86400:
        return f"{int(x // 3600)}h{int(x % 3600 // 60):02d}m"
    return f"{int(x // 86400)}d{int(x % 86400 // 3600):02d}h"


# ---------------------------------------------------------------------------
# hetsched status


def status_table(jobs: list[Any], width: int = UNLIMITED, now: float | None = None) -> Table:
    """``hetsched status``'s table: actual beside predicted (in brackets), where it runs.

    ``jobs`` are :class:`hetsched.app.status.JobStatus`. A plan column appears
    when the jobs come from more than one plan (``--all``, or a replanned batch).
    """
    import time

    from hetsched.app.status import when

    now = time.time() if now is None else now

    def pair(actual: str, predicted: str) -> str:
        return f"{actual} ({predicted})" if predicted != "-" else actual

    def dur(x: float | None) -> str:
        return fmt_s(x) if x is not None else "-"

    plans = len({j.plan_id for j in jobs}) > 1
    cols = [("job", "left", "name")] + ([("plan", "left", "name")] if plans else []) + [
        ("Slurm id", "right", "number"), ("state", "left", "number"),
        ("reason", "left", "list"), ("GPUs (node:index)", "left", "list"),
        ("start (pred.)", "left", "list"), ("end (pred.)", "left", "list"),
        ("JCT (pred.)", "left", "number"), ("iter s (pred.)", "left", "number")]
    rows = []
    for j in jobs:
        it = pair(f"{j.measured_iter_s:.3g}" if j.measured_iter_s is not None else "-",
                  f"{j.predicted_iter_s:.3g}" if j.predicted_iter_s is not None else "-")
        jct = pair(dur(j.measured_jct_s) if j.measured_jct_s is not None else (
            f"{dur(j.elapsed_s)}+" if j.elapsed_s is not None and j.actual_end is None
            else "-"), dur(j.predicted_jct_s))
        rows.append((j.job, *([j.plan_id] if plans else []), j.slurm_id,
                     j.state + (" !" if j.slow else ""), j.reason or "-",
                     j.placement or j.gpus or "-",
                     pair(when(j.actual_start, now), when(j.predicted_start, now)),
                     pair(when(j.actual_end, now), when(j.predicted_end, now)), jct, it))
    return folding_table("hetsched jobs", cols, rows, width)


def status_notes(jobs: list[Any]) -> list[str]:
    """Lines under the status table: slow jobs (the '!'), and each failed job's log."""
    from hetsched.app.status import SLOW

    out = [f"! {j.job}: {j.slow} (more than {SLOW:g}x)" for j in jobs if j.slow]
    out += [f"{j.job} {j.state.lower()}: log {j.log}"
            + (f" (last line: {j.cause})" if j.cause else "")
            for j in jobs if j.log]
    return out
