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

from hetsched.cli.tables import UNLIMITED, fmt_s, folding_table, print_table
from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import PoolTasks, TaskRow

PALETTE = ["cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan",
           "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "bright_red"]


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


def jobs_table(plan: Plan, width: int = UNLIMITED) -> Table:
    """One row per segment; on a WIDTH-column terminal other columns fold before names split."""
    if plan.mode == "pool" and plan.tasks is not None:
        return _pool_jobs_table(plan, plan.tasks, width)
    # co-located groups (Harmony): a "group" column naming the jobs a segment shares its GPUs with
    mates = _group_members(plan)
    cols = [("job", "left", "name"), ("w", "right", "number"), ("seg", "right", "number"),
            ("GPUs (node:count)", "left", "list"), ("local batches", "left", "list"),
            ("iter", "right", "number"), ("start", "right", "number"),
            ("end", "right", "number"), ("JCT", "right", "number")] + (
        [("group", "left", "list")] if mates else [])
    rows = []
    for jp in plan.jobs:
        for k, seg in enumerate(jp.segments):
            first = k == 0
            last = k == len(jp.segments) - 1
            rows.append((
                jp.name if first else "", f"{jp.weight:g}" if first else "",
                str(k + 1), gpus_summary(seg.workers), batches_summary(seg.workers),
                f"{seg.iteration_s * 1000:.1f}ms",
                fmt_s(seg.start_s), fmt_s(seg.end_s),
                fmt_s(jp.jct_s) if last else "",
                *([_group_cell(seg.group, jp.name, mates)] if mates else []),
            ))
    return folding_table(f"Plan ({plan.policy})", cols, rows, width)


def _pool_jobs_table(plan: Plan, tasks: PoolTasks, width: int) -> Table:
    """A pool plan, one row per job: the GPUs its tasks ran on over its life (time-shared
    with other jobs' tasks, not all at once), and the most tasks any of its rounds has
    times the largest local batch of a task (in an even plan, every round's shape)."""
    cols = [("job", "left", "name"), ("w", "right", "number"),
            ("GPUs used (node:count)", "left", "list"),
            ("max tasks x batch", "left", "list"),
            ("iter", "right", "number"), ("start", "right", "number"),
            ("end", "right", "number"), ("JCT", "right", "number")]
    rows: list[tuple[str, ...]] = []
    for jp in plan.jobs:
        t = tasks.jobs.get(jp.name)
        seg = jp.segments[0] if jp.segments else None
        rows.append((jp.name, f"{jp.weight:g}", gpus_summary(seg.workers) if seg else "-",
                     f"{t.tasks_per_round} x {t.local_batch}" if t else "-",
                     f"{seg.iteration_s * 1000:.1f}ms" if seg else "-",
                     fmt_s(jp.start_s), fmt_s(jp.end_s), fmt_s(jp.jct_s)))
    return folding_table(f"Plan ({plan.policy})", cols, rows, width)


def _group_members(plan: Plan) -> dict[str, list[str]]:
    """Group id -> the jobs that ever ran in it (co-located groups, Harmony)."""
    out: dict[str, list[str]] = {}
    for jp in plan.jobs:
        for seg in jp.segments:
            if seg.group is not None and jp.name not in out.setdefault(seg.group, []):
                out[seg.group].append(jp.name)
    return out


def _group_cell(group: str | None, name: str, mates: dict[str, list[str]]) -> str:
    if group is None:
        return "-"
    return f"{group}: with " + ", ".join(n for n in mates[group] if n != name)


def summary_table(plan: Plan) -> Table:
    tab = Table(show_header=False, box=None)
    tab.add_column(style="bold")
    tab.add_column()
    tab.add_row("total weighted JCT", f"{plan.weighted_jct_s:,.1f} s ({fmt_s(plan.weighted_jct_s)})")
    tab.add_row("average JCT", f"{plan.avg_jct_s:,.1f} s ({fmt_s(plan.avg_jct_s)})")
    tab.add_row("makespan", f"{plan.makespan_s:,.1f} s ({fmt_s(plan.makespan_s)})")
    tab.add_row("Jain fairness", f"{plan.fairness:.3f}")
    kind = plan.lower_bound_extra.get("kind")
    # a kind names the bound ("lp" -> "lp bound") unless it says so itself (a pool plan's)
    tab.add_row("lower bound", f"{plan.lower_bound_s:,.1f} s (gap {plan.gap * 100:.1f}%" + (
        ")" if not kind else f", {kind})" if "bound" in str(kind) else f", {kind} bound)"))
    tab.add_row("planning time", f"{plan.planning_time_s:.3f} s")
    if plan.candidates:
        best = min(plan.candidates.values())
        tab.add_row("auto candidates", ", ".join(
            f"{k} {v / best:.3f}x" for k, v in sorted(plan.candidates.items(), key=lambda kv: kv[1])))
    opd = plan.extra.get("opd")
    if isinstance(opd, dict) and "alpha" in opd:  # alpha beside opd's plans
        proved = "proved" if opd.get("bound_proved") else "not proved for this variant"
        tab.add_row("opd alpha", f"{opd['alpha']} (paper's bound 4*alpha = "
                    f"{opd.get('competitive_bound')}, {proved})")
    if plan.notes.no_group:
        tab.add_row("co-location", f"no group formed: {plan.notes.no_group}")
    skipped = plan.notes.skipped
    if skipped:
        tab.add_row("auto skipped", "\n".join(f"{k}: {v}" for k, v in skipped.items()))
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
            if seg.group is not None:  # sharing its GPUs with a co-located group
                mark = mark.lower()
            s = int((seg.start_s - t0) / span * (width - 1))
            e = max(s, int((seg.end_s - t0) / span * (width - 1)))
            r = int((seg.start_s + seg.restart_s - t0) / span * (width - 1))
            for x in range(s, e + 1):
                row[x] = "." if x < r else mark
                styles[x] = color
        out.append(f"{jp.name[:name_w]:<{name_w}} |", style="bold")
        for ch, st in zip(row, styles, strict=True):
            out.append(ch, style=st or None)
        counts = [len(seg.workers) for seg in jp.segments] or [0]
        groups = sorted({seg.group for seg in jp.segments if seg.group is not None})
        out.append(f"| {'>'.join(map(str, counts))} GPUs"
                   + (f" shared in {','.join(groups)}" if groups else "") + "\n")
    out.append(f"{'':{name_w}}  '-' waiting, '.' restarting, letter = main GPU type of the "
               "segment; GPUs per segment (2>4: two, then four)\n",
               style="dim")
    if any(seg.group is not None for jp in plan.jobs for seg in jp.segments):
        out.append(f"{'':{name_w}}  lower-case letter: the job shares its GPUs with a "
                   "co-located group (Harmony); 'shared in g1' names the group\n", style="dim")
    return out


def render_plan(plan: Plan, console: Console, gantt: bool = True) -> None:
    parts: list[Any] = [jobs_table(plan, console.width), summary_table(plan)]
    if gantt:
        parts.append(text_gantt(plan, width=max(40, min(100, console.width - 40))))
    print_table(console, Group(*parts))


def plan_yaml(plan: Plan) -> str:
    return yaml.safe_dump(json.loads(plan.to_json()), sort_keys=False)


def _finish_gantt(fig: Any, ax: Any, labels: list[str], title: str, plan: Plan,
                  path: str | Path) -> None:
    """Axes, title, legend and the file of a per-GPU Gantt chart (both modes)."""
    from hetsched.cli.pictures import human_time_axis, save_png

    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(-1, len(labels))
    ax.invert_yaxis()
    human_time_axis(ax, max(plan.makespan_s, 1e-9))
    ax.set_title(f"{title}: weighted JCT {plan.weighted_jct_s:,.0f} s, "
                 f"makespan {plan.makespan_s:,.0f} s")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=120)  # whole or not at all


# ---------------------------------------------------------------------------
# Pool mode: per-GPU views of the plan's ``tasks`` section

JOB_MARKS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _pool_rows(plan: Plan) -> list[tuple[str, list[TaskRow]]]:
    """(GPU label, expanded task rows) per GPU of a pool plan."""
    gpus = plan.tasks.gpus if plan.tasks is not None else []
    return [(f"{g.node}/{g.gpu}", g.rows()) for g in gpus]


def text_gantt_pool(plan: Plan, width: int = 72, max_gpus: int = 48) -> Text:
    """One row per GPU; each column shows the job that used the GPU most in that time slice.

    Letters stand for jobs (legend below; they repeat after 62 jobs), '.' is idle.
    """
    rows = _pool_rows(plan)
    out = Text()
    if not rows:
        return out
    t0 = min(j.arrival_s for j in plan.jobs)
    t1 = max(j.end_s for j in plan.jobs)
    span = max(t1 - t0, 1e-9)
    mark = {j.name: JOB_MARKS[k % len(JOB_MARKS)] for k, j in enumerate(plan.jobs)}
    color = {j.name: PALETTE[k % len(PALETTE)] for k, j in enumerate(plan.jobs)}
    label_w = min(24, max(len(lbl) for lbl, _ in rows))
    out.append(f"{'':{label_w}} |{fmt_s(0):<{width // 2}}{fmt_s(span):>{width - width // 2}}|\n",
               style="dim")
    for lbl, tasks in rows[:max_gpus]:
        busy: list[dict[str, float]] = [{} for _ in range(width)]
        for r in tasks:
            a = (float(r.start_s) - t0) / span * width
            b = (float(r.end_s) - t0) / span * width
            for x in range(max(0, int(a)), min(width, int(b) + 1)):
                cover = min(b, x + 1) - max(a, x)
                if cover > 0:
                    busy[x][r.job] = busy[x].get(r.job, 0.0) + cover
        out.append(f"{lbl[:label_w]:<{label_w}} |", style="bold")
        for cell in busy:
            if not cell:
                out.append(".", style="dim")
            else:
                job = max(cell, key=lambda k: cell[k])
                out.append(mark[job], style=color[job])
        out.append(f"| {len(tasks)} tasks\n")
    if len(rows) > max_gpus:
        out.append(f"{'':{label_w}}  ... {len(rows) - max_gpus} more GPUs (see --format json)\n",
                   style="dim")
    legend = ", ".join(f"{mark[j.name]}={j.name}" for j in plan.jobs[:len(JOB_MARKS)])
    more = " (letters repeat)" if len(plan.jobs) > len(JOB_MARKS) else ""
    out.append(f"{'':{label_w}}  '.' idle; {legend}{more}\n", style="dim")
    return out


def pool_summary_table(plan: Plan) -> Table:
    """Pool-specific facts: task sizes, compaction, memory plan, bound method."""
    tasks = plan.tasks if plan.tasks is not None else PoolTasks({}, [])
    tab = Table(show_header=False, box=None)
    tab.add_column(style="bold")
    tab.add_column()
    its = sorted({v.iterations_per_task for v in tasks.jobs.values()})
    tab.add_row("tasks", f"{tasks.total_tasks or 0:,} ({tasks.stored_rows or 0:,} "
                         "rows stored after pattern compaction)")
    if its:
        # a round's tasks accumulate their iterations into one optimizer step
        # (runtime/executor): say what that does to the batch a step sees
        tab.add_row("iterations per task", (f"{its[0]}" if len(its) == 1
                                            else f"{its[0]}..{its[-1]} (per job)")
                    + ("; one optimizer step per round: that many global batches a step"
                       if its[-1] > 1 else ""))
    fused = max((n for v in tasks.jobs.values() for n in (v.chunk or {}).values()), default=0)
    if fused:
        tab.add_row("fused passes", f"a pass trains up to {fused:,} samples of several "
                                    "steps' slices (the job's chunk per GPU type)")
    mem = tasks.memory
    if mem is not None:
        tab.add_row("memory plan", f"{mem.warm_starts:,} warm starts, "
                                   f"{mem.model_loads:,} model loads")
    _bound_rows(tab, plan)
    return tab


def _bound_rows(tab: Table, plan: Plan) -> None:
    """Where a pool plan's bound comes from: its two parts on compute alone (every plan
    pool mode may keep) and the pool relaxation, which bounds equal-slice plans only."""
    lb, method = plan.lower_bound_extra, plan.params.get("bound")
    if "alone_s" in lb:
        tab.add_row("bound parts", f"each job alone {lb['alone_s']:,.1f} s, pooled speed "
                                   f"{lb['pooled_s']:,.1f} s" + (
                                       f", joint LP {lb['lp_s']:,.1f} s" if "lp_s" in lb
                                       else ""))
        if "pool_relaxation_s" in lb:
            tab.add_row("pool relaxation", f"{lb['pool_relaxation_s']:,.1f} s"
                        + (f" ({method})" if method else "")
                        + ": bounds equal-slice plans only")
    elif method:
        tab.add_row("lower bound from", f"the pool relaxation ({method})")
    a = plan.params.get("alpha")
    if a is not None:
        tab.add_row("alpha (Hare)", f"{float(a):.3g}: Hare's alpha(2+alpha) guarantee holds "
                                    "for the paper's MIQP order only")


def render_pool_plan(plan: Plan, console: Console, gantt: bool = True) -> None:
    """Pool-mode table output: jobs, summary, pool facts and the per-GPU text Gantt."""
    parts: list[Any] = [jobs_table(plan, console.width), summary_table(plan),
                        pool_summary_table(plan)]
    if gantt:
        parts.append(text_gantt_pool(plan, width=max(40, min(100, console.width - 40))))
    print_table(console, Group(*parts))


def png_gantt_pool(plan: Plan, path: str | Path) -> None:
    """Per-GPU Gantt chart of a pool plan: one bar per run of back-to-back tasks of a job."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _pool_rows(plan)
    colour = {j.name: k for k, j in enumerate(plan.jobs)}
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, max(3, 0.28 * len(rows) + 1.5)))
    for y, (_, tasks) in enumerate(rows):
        bars: dict[str, list[tuple[float, float]]] = {}
        cur: list[Any] | None = None
        for r in tasks:  # merge back-to-back tasks of one job into one bar
            if cur is not None and cur[0] == r.job and float(r.start_s) - cur[2] < 1e-6:
                cur[2] = float(r.end_s)
                continue
            if cur is not None:
                bars.setdefault(cur[0], []).append((cur[1], cur[2] - cur[1]))
            cur = [r.job, float(r.start_s), float(r.end_s)]
        if cur is not None:
            bars.setdefault(cur[0], []).append((cur[1], cur[2] - cur[1]))
        for job, spans in bars.items():
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=cmap(colour[job] % 20))
    for jp in plan.jobs[:40]:
        ax.barh(-10, 0, color=cmap(colour[jp.name] % 20), label=jp.name)
    _finish_gantt(fig, ax, [lbl for lbl, _ in rows], f"{plan.policy} (pool)", plan, path)
