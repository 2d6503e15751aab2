"""PNG pictures of plans and runs, readable at 6, 60 and 600 jobs.

* **Few jobs** (at most :data:`PER_GPU_MAX_JOBS` jobs and :data:`PER_GPU_MAX_GPUS`
  GPUs): one row per GPU, one colour per job (no colour repeats), the job's
  name on its bar where it fits; restarts hatched, idle time left white.
* **Many jobs** (up to :data:`SUMMARY_ABOVE`): one row per job, each segment
  coloured by its main GPU type, waiting time (arrival to start) as a thin
  grey line, restarts hatched; the job names are the row labels.
* **More jobs than that**: a summary that fits one screen (at most 11 inches
  tall): one panel per GPU type with its GPUs busy over time against how many
  it has, and below them the segments running and the jobs waiting over time;
  the per-job chart goes to a second file beside it (``NAME-jobs.png``).
* **Time axis in human units** (minutes, hours or days chosen from the span;
  never raw seconds with an offset), a legend for every mark used.
* :func:`png_predicted_vs_measured`: measured against predicted iteration time
  per job from the job reports (``hetsched status --png``), with the ±10% band.

Each function returns a small description of what it drew (layout, rows,
tick labels) so tests can check the picture's structure; tests also keep the
PNGs as artefacts for a person to look at.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from hetsched.core.plan import Plan

PER_GPU_MAX_JOBS = 20
PER_GPU_MAX_GPUS = 64
#: above this many jobs png_gantt draws the one-screen summary (and the per-job chart apart)
SUMMARY_ABOVE = 100
#: (unit seconds, suffix) from the largest down; the first whose span holds 2 units is used
UNITS = ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))


def time_unit(span_s: float) -> tuple[float, str]:
    for size, name in UNITS:
        if span_s >= 2 * size:
            return size, name
    return 1.0, "s"


def human_time_axis(ax: Any, span_s: float) -> str:
    """Ticks at round numbers of the unit the span calls for; returns the unit's name."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    size, name = time_unit(span_s)

    class _Locator(MaxNLocator):  # round numbers of the unit, not of seconds
        def tick_values(self, vmin: float, vmax: float) -> Any:
            import numpy as np

            return np.asarray(super().tick_values(vmin / size, vmax / size)) * size

    ax.xaxis.set_major_locator(_Locator(nbins=10, steps=[1, 2, 2.5, 5, 10]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x / size:g}"))
    ax.set_xlabel(f"time since the first arrival ({name})")
    return name


def save_png(fig: Any, path: str | Path, **savefig: Any) -> None:
    """Render ``fig`` as a PNG (``savefig``: matplotlib's options, default 110 dpi with a
    tight box) and write it to ``path`` whole or not at all; closes the figure."""
    import io

    import matplotlib.pyplot as plt

    from hetsched.io.files import write_user_file

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", **(savefig or {"dpi": 110, "bbox_inches": "tight"}))
    finally:
        plt.close(fig)
    write_user_file(path, buf.getvalue())  # whole or not at all


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_gantt(plan: Plan, path: str | Path, jobs_path: str | Path | None = None
              ) -> dict[str, Any]:
    """The plan's Gantt chart: per-GPU rows for few jobs, per-job rows for many, and
    above :data:`SUMMARY_ABOVE` jobs a one-screen summary at ``path`` with the per-job
    chart at ``jobs_path`` (default ``<path stem>-jobs.png`` beside it)."""
    gpus = {(w.node, w.gpu) for jp in plan.jobs for s in jp.segments for w in s.workers}
    if len(plan.jobs) <= PER_GPU_MAX_JOBS and len(gpus) <= PER_GPU_MAX_GPUS:
        return _per_gpu(plan, sorted(gpus), path)
    if len(plan.jobs) <= SUMMARY_ABOVE:
        return _per_job(plan, path)
    p = Path(path)
    jobs_file = Path(jobs_path) if jobs_path else p.with_name(f"{p.stem}-jobs{p.suffix}")
    per_job = _per_job(plan, jobs_file)
    return {**_summary(plan, p), "jobs_file": str(jobs_file), "jobs_rows": per_job["rows"]}


def _summary(plan: Plan, path: Path) -> dict[str, Any]:
    """Per GPU type: GPUs busy over time (of how many); below: jobs running and waiting."""
    import numpy as np

    plt = _pyplot()
    t0 = min(j.arrival_s for j in plan.jobs)
    span = max(plan.makespan_s, 1e-9)
    cluster = plan.cluster or {}
    total: Counter[str] = Counter()
    for n in cluster.get("nodes", []):
        names = n.get("names", n.get("name"))
        count = len(names) if isinstance(names, list) else 1
        total[str(n.get("gpu_type", "?")).lower()] += int(n.get("gpus", 0)) * count
    used_types = sorted({w.gpu_type for jp in plan.jobs for s in jp.segments for w in s.workers})
    types = [t for t in sorted(set(total) | set(used_types)) if t in used_types or total[t]]
    grid = np.linspace(0.0, span, 400)
    busy = {t: np.zeros_like(grid) for t in types}
    running = np.zeros_like(grid)
    waiting = np.zeros_like(grid)
    for jp in plan.jobs:
        a = jp.arrival_s - t0
        if jp.segments:
            waiting += (grid >= a) & (grid < jp.start_s - t0)
        for seg in jp.segments:
            on = (grid >= seg.start_s - t0) & (grid < seg.end_s - t0)
            running += on
            held: Counter[str] = Counter()
            for w in seg.workers:
                held[w.gpu_type] += 1
            for t, k in held.items():
                busy[t] += on * k
    fig, axes = plt.subplots(len(types) + 1, 1, sharex=True,
                             figsize=(13, min(2.2 + 1.5 * (len(types) + 1), 11.0)))
    cmap = plt.get_cmap("tab10")
    for k, (ax, t) in enumerate(zip(axes[:-1], types, strict=True)):
        cap = total[t] or int(busy[t].max()) or 1
        ax.fill_between(grid, busy[t], step="post", color=cmap(k % 10), alpha=0.8,
                        label=f"{t}: GPUs busy")
        ax.axhline(cap, color="black", lw=0.8, ls="--", label=f"{t}: {cap} GPUs")
        ax.set_ylim(0, cap * 1.08)
        ax.set_ylabel(t, rotation=0, ha="right", va="center")
        mean = float(np.mean(busy[t])) / cap
        ax.text(1.0, 1.02, f"mean busy {mean:.0%}", transform=ax.transAxes, ha="right",
                va="bottom", fontsize=8)
        ax.grid(axis="x", color="0.9")
    ax = axes[-1]
    ax.plot(grid, running, color="black", lw=1.2, label="segments running")
    ax.fill_between(grid, waiting, step="post", color="silver", label="jobs waiting")
    ax.set_ylabel("jobs", rotation=0, ha="right", va="center")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="x", color="0.9")
    unit = human_time_axis(ax, span)
    ax.set_xlim(0, span * 1.01)
    axes[0].set_title(_title(plan) + " (summary; one row per job: the -jobs file)")
    fig.canvas.draw()
    ticks = [tk.get_text() for tk in ax.get_xticklabels()]
    size = fig.get_size_inches()
    save_png(fig, path)
    return {"layout": "summary", "rows": len(types) + 1, "types": types, "unit": unit,
            "xticks": ticks, "inches": (float(size[0]), float(size[1]))}


def _title(plan: Plan) -> str:
    return (f"{plan.policy}: {len(plan.jobs)} jobs, weighted JCT {plan.weighted_jct_s / 3600:,.2f} h, "
            f"makespan {plan.makespan_s / 3600:,.2f} h")


def _legend_marks(waiting: bool) -> list[Any]:
    from matplotlib.patches import Patch

    marks = [Patch(facecolor="lightgrey", hatch="//", edgecolor="black", label="restart")]
    if waiting:
        marks.append(Patch(facecolor="silver", edgecolor="none", label="waiting (queued)"))
    else:
        marks.append(Patch(facecolor="white", edgecolor="grey", label="idle"))
    return marks


def _per_gpu(plan: Plan, keys: list[tuple[str, int]], path: str | Path) -> dict[str, Any]:
    from matplotlib.patches import Patch

    plt = _pyplot()
    row = {k: i for i, k in enumerate(keys)}
    cmap = plt.get_cmap("tab20" if len(plan.jobs) > 10 else "tab10")
    t0 = min(j.arrival_s for j in plan.jobs)
    span = max(plan.makespan_s, 1e-9)
    fig, ax = plt.subplots(figsize=(12, max(3.0, 0.32 * len(keys) + 1.6)))
    handles = []
    lanes = _group_lanes(plan)
    # a label's width in seconds of the time axis (fontsize 7: ~0.6 em per character)
    axis_px = 12 * 110 * 0.72
    char_s = 7 * 0.6 * 110 / 72 / axis_px * span * 1.01
    labels_drawn = 0
    for n, jp in enumerate(plan.jobs):
        colour = cmap(n % cmap.N)
        handles.append(Patch(facecolor=colour, edgecolor="black", label=jp.name))
        for seg in jp.segments:
            width = seg.end_s - seg.start_s
            # a co-located group (Harmony) splits the GPU's row into one lane per member
            lane, of = lanes.get((seg.group, jp.name), (0, 1))
            ys = []
            for w in seg.workers:
                y = row[(w.node, w.gpu)] - 0.4 + (lane + 0.5) * 0.8 / of
                ys.append(y)
                ax.barh(y, width, left=seg.start_s - t0, color=colour, edgecolor="black",
                        linewidth=0.3, height=0.8 / of,
                        hatch="xx" if seg.group is not None else None)
                if seg.restart_s > 0:
                    ax.barh(y, seg.restart_s, left=seg.start_s - t0, color="lightgrey",
                            hatch="//", edgecolor="black", linewidth=0.3)
            # the name once per segment (its middle row), only where it fits on the bar
            # and its lane is tall enough: the legend names every job anyway
            free = width - seg.restart_s - 0.02 * span
            if ys and of <= 2 and free >= (len(jp.name) + 1) * char_s:
                ax.text(seg.start_s - t0 + seg.restart_s + 0.01 * span,
                        sorted(ys)[len(ys) // 2], jp.name, va="center", ha="left",
                        fontsize=7 if of == 1 else 6, clip_on=True)
                labels_drawn += 1
    labels = [f"{node}/gpu{g}" for node, g in keys]
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(len(keys) - 0.5, -0.5)
    unit = human_time_axis(ax, span)
    ax.set_xlim(0, span * 1.01)
    ax.set_title(_title(plan))
    ax.legend(handles=handles + _legend_marks(waiting=False), loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    save_png(fig, path)
    return {"layout": "per-gpu", "rows": len(keys), "unit": unit, "xticks": ticks,
            "labels": labels_drawn}


def _group_lanes(plan: Plan) -> dict[tuple[str | None, str], tuple[int, int]]:
    """(group id, job) -> (lane, lanes): members of a co-located group share a GPU row."""
    members: dict[str, list[str]] = {}
    for jp in plan.jobs:
        for seg in jp.segments:
            if seg.group is not None and jp.name not in members.setdefault(seg.group, []):
                members[seg.group].append(jp.name)
    return {(g, n): (k, len(ns)) for g, ns in members.items() for k, n in enumerate(ns)}


def _main_type(seg: Any) -> str:
    types = Counter(w.gpu_type for w in seg.workers)
    return types.most_common(1)[0][0] if types else "?"


def _per_job(plan: Plan, path: str | Path) -> dict[str, Any]:
    from matplotlib.patches import Patch

    plt = _pyplot()
    types = sorted({_main_type(s) for jp in plan.jobs for s in jp.segments})
    cmap = plt.get_cmap("tab10")
    colour = {t: cmap(i % 10) for i, t in enumerate(types)}
    jobs = sorted(plan.jobs, key=lambda j: (j.start_s, j.name))
    t0 = min(j.arrival_s for j in plan.jobs)
    span = max(plan.makespan_s, 1e-9)
    n = len(jobs)
    row_h = 0.3 if n <= 80 else 0.14
    fig, ax = plt.subplots(figsize=(13, min(0.5 + row_h * n + 1.6, 160.0)))
    for y, jp in enumerate(jobs):
        if jp.segments and jp.start_s > jp.arrival_s:
            ax.plot([jp.arrival_s - t0, jp.start_s - t0], [y, y], color="silver", lw=1.2,
                    solid_capstyle="butt")
        for seg in jp.segments:
            ax.barh(y, seg.end_s - seg.start_s, left=seg.start_s - t0, height=0.8,
                    color=colour[_main_type(seg)], edgecolor="black" if n <= 80 else "none",
                    linewidth=0.3)
            if seg.restart_s > 0:
                ax.barh(y, seg.restart_s, left=seg.start_s - t0, height=0.8, color="lightgrey",
                        hatch="//", edgecolor="black", linewidth=0.2)
    fontsize = 8 if n <= 80 else 5
    ax.set_yticks(range(n))
    ax.set_yticklabels([j.name for j in jobs], fontsize=fontsize)
    ax.set_ylim(n - 0.5, -0.5)
    unit = human_time_axis(ax, span)
    ax.set_xlim(0, span * 1.01)
    ax.set_title(_title(plan) + " (one row per job, by start)")
    handles = [Patch(facecolor=colour[t], edgecolor="black", label=f"on {t}") for t in types]
    ax.legend(handles=handles + _legend_marks(waiting=True), loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.grid(axis="x", color="0.9")
    if n > 80:  # a tall chart: the time axis on top too
        ax.tick_params(axis="x", labeltop=True, top=True)
    fig.canvas.draw()
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    save_png(fig, path)
    return {"layout": "per-job", "rows": n, "unit": unit, "xticks": ticks}


def png_predicted_vs_measured(rows: list[dict[str, Any]], path: str | Path) -> dict[str, Any]:
    """Measured against predicted iteration time, one point per job with both (log-log)."""
    plt = _pyplot()
    pts = [(r["predicted_iter_s"], r["measured_iter_s"], r["job"]) for r in rows
           if r.get("predicted_iter_s") and r.get("measured_iter_s")]
    fig, ax = plt.subplots(figsize=(6.5, 6))
    if pts:
        xs, ys, names = zip(*pts, strict=True)
        lo, hi = min(min(xs), min(ys)) * 0.7, max(max(xs), max(ys)) * 1.4
        ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9",
                        label="within 10%")
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, label="measured = predicted")
        ax.scatter(xs, ys, s=18, zorder=3, label="job")
        hidden = _annotate_apart(ax, pts, lo, hi) if len(pts) <= 30 else len(pts)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    else:
        ax.text(0.5, 0.5, "no job has both a prediction and a measurement yet",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("predicted iteration time (s)")
    ax.set_ylabel("measured iteration time (s), from the job reports")
    within = sum(abs(y / x - 1) <= 0.10 for x, y, _ in pts)
    ax.set_title(f"{len(pts)} jobs measured, {within} within 10% of the plan")
    if pts:
        ax.legend(loc="upper left", fontsize=8)
    save_png(fig, path)
    return {"points": len(pts), "within_10pct": within,
            "labels": len(pts) - hidden if pts else 0}


def _annotate_apart(ax: Any, pts: list[tuple[float, float, str]], lo: float, hi: float
                    ) -> int:
    """Name each point where its label overlaps no label already drawn; returns how many
    were left out (a note on the chart says so)."""
    import math

    span = math.log(hi / lo) or 1.0
    placed: list[tuple[float, float, float]] = []  # (x, y, width) in axes fractions
    hidden = 0
    for x, y, name in sorted(pts, key=lambda p: (-p[1], p[0])):
        fx, fy = math.log(x / lo) / span + 0.01, math.log(y / lo) / span + 0.01
        w = 0.011 * (len(name) + 1)
        if any(abs(fy - py) < 0.03 and fx < px + pw and px < fx + w for px, py, pw in placed):
            hidden += 1
            continue
        placed.append((fx, fy, w))
        ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if hidden:
        ax.text(0.99, 0.01, f"{hidden} labels left out (they would overlap)",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="grey")
    return hidden
