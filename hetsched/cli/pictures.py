"""PNG pictures of plans and runs, readable at 6, 60 and 600 jobs.

* **Few jobs** (at most :data:`PER_GPU_MAX_JOBS` jobs and :data:`PER_GPU_MAX_GPUS`
  GPUs): one row per GPU, one colour per job (no colour repeats), the job's
  name on its bar where it fits; restarts hatched, idle time left white.
* **Many jobs**: one row per job, each segment coloured by its main GPU type,
  waiting time (arrival to start) as a thin grey line, restarts hatched; the
  job names are the row labels.
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
from hetsched.errors import InputError

PER_GPU_MAX_JOBS = 20
PER_GPU_MAX_GPUS = 64
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


def _save(fig: Any, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    except OSError as e:
        raise InputError(str(path), f"cannot write the PNG: {e}") from None
    finally:
        plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_gantt(plan: Plan, path: str | Path) -> dict[str, Any]:
    """The plan's Gantt chart: per-GPU rows for few jobs, per-job rows for many."""
    gpus = {(w.node, w.gpu) for jp in plan.jobs for s in jp.segments for w in s.workers}
    if len(plan.jobs) <= PER_GPU_MAX_JOBS and len(gpus) <= PER_GPU_MAX_GPUS:
        return _per_gpu(plan, sorted(gpus), path)
    return _per_job(plan, path)


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
    for n, jp in enumerate(plan.jobs):
        colour = cmap(n % cmap.N)
        handles.append(Patch(facecolor=colour, edgecolor="black", label=jp.name))
        for seg in jp.segments:
            width = seg.end_s - seg.start_s
            # a co-located group (Harmony) splits the GPU's row into one lane per member
            lane, of = lanes.get((seg.group, jp.name), (0, 1))
            for w in seg.workers:
                y = row[(w.node, w.gpu)] - 0.4 + (lane + 0.5) * 0.8 / of
                ax.barh(y, width, left=seg.start_s - t0, color=colour, edgecolor="black",
                        linewidth=0.3, height=0.8 / of,
                        hatch="xx" if seg.group is not None else None)
                if seg.restart_s > 0:
                    ax.barh(y, seg.restart_s, left=seg.start_s - t0, color="lightgrey",
                            hatch="//", edgecolor="black", linewidth=0.3)
                if width > 0.08 * span:  # the name fits on the bar
                    ax.text(seg.start_s - t0 + seg.restart_s + 0.01 * span, y, jp.name,
                            va="center", ha="left", fontsize=7, clip_on=True)
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
    _save(fig, path)
    return {"layout": "per-gpu", "rows": len(keys), "unit": unit, "xticks": ticks}


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
    _save(fig, path)
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
        if len(pts) <= 30:
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
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
    _save(fig, path)
    return {"points": len(pts), "within_10pct": within}
