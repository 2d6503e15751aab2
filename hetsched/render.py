"""Rendering a Plan: rich tables, a text Gantt chart, a PNG Gantt chart, YAML/JSON."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from hetsched.errors import InputError
from hetsched.plan import Plan

PALETTE = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "bright_red"]


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


def gpus_summary(workers: list[Any]) -> str:
    """'v100-1:4 + k80-2:2' (node:count), grouped."""
    c = Counter(w.node for w in workers)
    return " + ".join(f"{n}:{k}" for n, k in c.items())


def batches_summary(workers: list[Any]) -> str:
    """Local batches per GPU type: 'v100 4x48, k80 2x16' (ranges where they differ)."""
    by: dict[str, list[int]] = {}
    for w in workers:
        by.setdefault(w.gpu_type, []).append(w.local_batch)
    parts = []
    for t, bs in by.items():
        lo, hi = min(bs), max(bs)
        parts.append(f"{t} {len(bs)}x{lo}" if lo == hi else f"{t} {len(bs)}x{lo}-{hi}")
    return ", ".join(parts)


def jobs_table(plan: Plan) -> Table:
    tab = Table(title=f"Plan ({plan.policy})", show_lines=False, header_style="bold")
    for col, just in (("job", "left"), ("w", "right"), ("seg", "right"), ("GPUs (node:count)", "left"),
                      ("local batches", "left"), ("iter", "right"), ("start", "right"),
                      ("end", "right"), ("JCT", "right")):
        tab.add_column(col, justify=just)  # type: ignore[arg-type]
    for jp in plan.jobs:
        for k, seg in enumerate(jp.segments):
            first = k == 0
            last = k == len(jp.segments) - 1
            tab.add_row(
                jp.name if first else "", f"{jp.weight:g}" if first else "",
                str(k + 1), gpus_summary(seg.workers), batches_summary(seg.workers),
                f"{seg.iteration_s * 1000:.1f}ms",
                fmt_s(seg.start_s), fmt_s(seg.end_s),
                fmt_s(jp.jct_s) if last else "",
            )
    return tab


def summary_table(plan: Plan) -> Table:
    tab = Table(show_header=False, box=None)
    tab.add_column(style="bold")
    tab.add_column()
    tab.add_row("total weighted JCT", f"{plan.weighted_jct_s:,.1f} s ({fmt_s(plan.weighted_jct_s)})")
    tab.add_row("average JCT", f"{plan.avg_jct_s:,.1f} s ({fmt_s(plan.avg_jct_s)})")
    tab.add_row("makespan", f"{plan.makespan_s:,.1f} s ({fmt_s(plan.makespan_s)})")
    tab.add_row("Jain fairness", f"{plan.fairness:.3f}")
    tab.add_row("lower bound", f"{plan.lower_bound_s:,.1f} s (gap {plan.gap * 100:.1f}%)")
    tab.add_row("planning time", f"{plan.planning_time_s:.3f} s")
    if plan.candidates:
        best = min(plan.candidates.values())
        tab.add_row("auto candidates", ", ".join(
            f"{k} {v / best:.3f}x" for k, v in sorted(plan.candidates.items(), key=lambda kv: kv[1])))
    return tab


def text_gantt(plan: Plan, width: int = 72) -> Text:
    """One row per job over the plan's time span; letters mark GPU types, '.' restart."""
    t0 = min(j.arrival_s for j in plan.jobs)
    t1 = max(j.end_s for j in plan.jobs)
    span = max(t1 - t0, 1e-9)
    name_w = min(24, max(len(j.name) for j in plan.jobs))
    out = Text()
    out.append(f"{'':{name_w}} |{fmt_s(0):<{width // 2}}{fmt_s(span):>{width - width // 2}}|\n",
               style="dim")
    for k, jp in enumerate(plan.jobs):
        row = [" "] * width
        styles = [""] * width
        a = int((jp.arrival_s - t0) / span * (width - 1))
        if jp.segments:
            for x in range(a, int((jp.start_s - t0) / span * (width - 1)) + 1):
                row[x] = "-"
        color = PALETTE[k % len(PALETTE)]
        for seg in jp.segments:
            types = Counter(w.gpu_type for w in seg.workers)
            mark = types.most_common(1)[0][0][0].upper() if types else "#"
            s = int((seg.start_s - t0) / span * (width - 1))
            e = max(s, int((seg.end_s - t0) / span * (width - 1)))
            r = int((seg.start_s + seg.restart_s - t0) / span * (width - 1))
            for x in range(s, e + 1):
                row[x] = "." if x < r else mark
                styles[x] = color
        out.append(f"{jp.name[:name_w]:<{name_w}} |", style="bold")
        for ch, st in zip(row, styles, strict=True):
            out.append(ch, style=st or None)
        out.append(f"| {len(jp.segments[-1].workers) if jp.segments else 0} GPUs\n")
    out.append(f"{'':{name_w}}  '-' waiting, '.' restarting, letter = main GPU type of the segment\n",
               style="dim")
    return out


def render_plan(plan: Plan, console: Console, gantt: bool = True) -> None:
    parts: list[Any] = [jobs_table(plan), summary_table(plan)]
    if gantt:
        parts.append(text_gantt(plan, width=max(40, min(100, console.width - 40))))
    console.print(Group(*parts))


def plan_yaml(plan: Plan) -> str:
    return yaml.safe_dump(json.loads(plan.to_json()), sort_keys=False)


def png_gantt(plan: Plan, path: str | Path) -> None:
    """Per-GPU Gantt chart: one row per GPU, one colour per job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[tuple[str, int], int] = {}
    for jp in plan.jobs:
        for seg in jp.segments:
            for w in seg.workers:
                rows.setdefault((w.node, w.gpu), 0)
    keys = sorted(rows)
    for k, key in enumerate(keys):
        rows[key] = k
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, max(3, 0.28 * len(keys) + 1.5)))
    for n, jp in enumerate(plan.jobs):
        for seg in jp.segments:
            for w in seg.workers:
                y = rows[(w.node, w.gpu)]
                ax.barh(y, seg.end_s - seg.start_s, left=seg.start_s, color=cmap(n % 20),
                        edgecolor="black", linewidth=0.3)
                if seg.restart_s > 0:
                    ax.barh(y, seg.restart_s, left=seg.start_s, color="lightgrey", hatch="//",
                            edgecolor="black", linewidth=0.3)
        ax.barh(-10, 0, color=cmap(n % 20), label=jp.name)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"{n}/gpu{g}" for n, g in keys], fontsize=7)
    ax.set_ylim(-1, len(keys))
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(f"{plan.policy}: weighted JCT {plan.weighted_jct_s:,.0f} s, "
                 f"makespan {plan.makespan_s:,.0f} s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as e:
        raise InputError(str(path), f"cannot write the PNG: {e}") from None
    finally:
        plt.close(fig)
