"""Profiling use case: plan and render short sbatch probes per (workload, GPU type).

:func:`plan_probes` picks the (workload, GPU type) pairs with no usable profile
history and :func:`render_probes` writes one probe script per pair from the
probe template; :func:`hetsched.app.probe_run.run_probes` submits them all at
once, waits with one ``squeue`` per poll, cancels those past their time limit,
and stores what came back in the profile history (:mod:`hetsched.state.history`).
"""

from __future__ import annotations

import io
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hetsched.app.runnable import BUILTIN_SAMPLE_BYTES
from hetsched.core.spec import Job
from hetsched.core.throughput import ProfileRow
from hetsched.errors import InputError
from hetsched.io.files import atomic_write, private_dir
from hetsched.io.jobfiles import logs_dir, probes_dir
from hetsched.io.profiles import write_csv
from hetsched.state.history import (
    UNUSABLE,
    export_csv,
    forget,
    ingest_reports,
    listing,
    statuses,
    table_from_store,
    usable_pairs,
)
from hetsched.state.store import Store

# ---------------------------------------------------------------------------
# probes


@dataclass(frozen=True)
class ProbeSpec:
    workload: str
    gpu_type: str
    batches: tuple[int, ...]
    entrypoint: str | None = None
    #: CPU cores for the probe's GPU, as the job will have (its ``cpus_per_gpu``); 0: default
    cpus: int = 0
    #: the entrypoint's job's workdir: the probe runs there, as the job will
    workdir: str | None = None


#: a probe that never ran: it waited in the queue past --queue-wait, or Slurm did not
#: answer its sbatch. That says nothing about the pair, so nothing is recorded: the
#: next `hetsched profile` probes it again (marking it unusable made `plan` leave the
#: GPU type out for that workload, on any busy cluster)
NOT_RUN = "not run"
#: a probe whose ``hetsched probe`` exited 2 (bad input: its entrypoint, command or
#: data did not load). That fails the same on every GPU type and says nothing about
#: the pair, so nothing is recorded (marking the pair unusable made the next `profile`
#: skip it after the user had fixed the code, and `plan` refuse the workload)
NOT_LOADED = "did not load"


@dataclass
class ProbeOutcome:
    spec: ProbeSpec
    status: str = "pending"  # pending | ok | unusable | not run | did not load
    slurm_id: str | None = None
    reason: str = ""
    rows: list[ProfileRow] = field(default_factory=list)
    #: rows the probe measured but no step-time curve passes through (plausible_rows)
    dropped: list[str] = field(default_factory=list)
    out: Path | None = None
    script: Path | None = None
    #: the folder of the probe job's Slurm log (``%x-%j.out``): why a probe failed
    logs: Path | None = None
    submitted_at: float = 0.0
    started_at: float | None = None
    seconds: float | None = None


def default_batches(global_batch: int, points: int = 5) -> tuple[int, ...]:
    """A sweep for the affine fit: powers of two up to the job's global batch (>= 2 points)."""
    top = max(2, global_batch)
    out = [b for b in (2 ** k for k in range(1, 16)) if b <= top]
    if top not in out:
        out.append(top)
    if len(out) > points:  # keep the spread: smallest, largest and evenly spaced between
        idx = [round(i * (len(out) - 1) / (points - 1)) for i in range(points)]
        out = [out[i] for i in sorted(set(idx))]
    return tuple(out)


def parse_batches(text: str, source: str = "--batches") -> tuple[int, ...]:
    try:
        vals = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InputError(source, f"{text!r} is not a comma-separated list of integers") from None
    if not vals or vals[0] < 1:
        raise InputError(source, f"{text!r}: need local batch sizes >= 1, e.g. 8,16,32")
    return vals


def plan_probes(jobs: Sequence[Job], gpu_types: Sequence[str], store: Store | None, *,
                batches: Sequence[int] | None = None, force: bool = False,
                retry_unusable: bool = False,
                warn: Callable[[str], None] | None = None,
                ) -> tuple[list[ProbeSpec], dict[str, str]]:
    """Which (workload, GPU type) pairs need a probe; and why the others do not.

    A profile is per workload, so the jobs naming one workload share one probe
    per GPU type: it runs the first of them with an entrypoint (else the
    built-in of that name), sweeps local batches up to the largest of their
    global batches, and gets the most CPU cores any of them asks for. Jobs of
    one workload with different entrypoints are named through ``warn``: the
    probe measures one of them only.
    """
    have = usable_pairs(store) if store is not None else set()
    st = statuses(store) if store is not None else {}
    by_workload: dict[str, list[Job]] = {}
    for job in jobs:
        by_workload.setdefault(job.workload, []).append(job)
    specs: list[ProbeSpec] = []
    skipped: dict[str, str] = {}
    types = sorted({g.lower() for g in gpu_types})
    for workload, group in by_workload.items():
        entries = list(dict.fromkeys(j.entrypoint for j in group if j.entrypoint))
        if len(entries) > 1 and warn is not None:
            names = ", ".join(f"{j.name} ({j.entrypoint})" for j in group if j.entrypoint)
            warn(f"jobs of workload {workload!r} name different entrypoints: {names}; a "
                 f"profile is per workload, so the probes run {entries[0]} only (give the "
                 "others their own workload name if they train a different model)")
        entry = entries[0] if entries else None
        sweep = tuple(batches) if batches else default_batches(max(j.global_batch
                                                                   for j in group))
        cpus = max((j.slurm.cpus_per_gpu or 0) if j.slurm else 0 for j in group)
        allowed = [g for g in types
                   if any(j.gpu_types is None or g in j.gpu_types for j in group)]
        for g in allowed:
            key = (workload, g)
            label = f"{workload}/{g}"
            if not force and key in have:
                skipped[label] = "history"
            elif not force and not retry_unusable and st.get(key, {}).get("status") == UNUSABLE:
                skipped[label] = f"unusable ({st[key].get('reason') or 'probe failed'})"
            elif entry is None and workload not in BUILTIN_SAMPLE_BYTES:
                who = (f"job {group[0].name!r} has no" if len(group) == 1
                       else f"none of its {len(group)} jobs has an")
                skipped[label] = (f"{who} entrypoint and {workload!r} is not a built-in "
                                  f"workload ({', '.join(BUILTIN_SAMPLE_BYTES)}): nothing to "
                                  "probe (import a CSV with `hetsched profiles import`)")
            else:
                workdir = next((j.workdir for j in group if j.entrypoint == entry), None) \
                    if entry else None
                specs.append(ProbeSpec(workload, g, sweep, entry, cpus, workdir))
    return specs, skipped


def probes_summary(outs: Sequence[ProbeOutcome], wall_s: float) -> str:
    """The line a ``profile`` ends with: how many probes were ok, marked their pair
    unusable, did not run, or did not load the job's code (nothing recorded)."""
    ok, not_run, broken = (sum(o.status == s for o in outs) for s in ("ok", NOT_RUN,
                                                                       NOT_LOADED))
    return (f"{ok}/{len(outs)} probes ok in {wall_s:.1f} s; "
            f"{len(outs) - ok - not_run - broken} pairs marked unusable"
            + (f"; {not_run} not run (nothing recorded: profile again later)"
               if not_run else "")
            + (f"; {broken} did not load the job's code or data (nothing recorded: fix "
               "it, then profile again)" if broken else ""))


def nothing_to_probe(skipped: Mapping[str, str]) -> str:
    """The line for a ``profile`` that has no probe to run, by why each pair is skipped."""
    if not skipped:
        return "nothing to probe: no job may use a GPU type of this partition"
    history = sum(why == "history" for why in skipped.values())
    unusable = sum(why.startswith("unusable") for why in skipped.values())
    other = len(skipped) - history - unusable
    parts = [f"{history} have history"] if history else []
    if unusable:
        parts.append(f"{unusable} are marked unusable (--retry-unusable probes them)")
    if other:
        parts.append(f"{other} cannot be probed (see above)")
    return f"nothing to probe: of {len(skipped)} (workload, GPU type) pairs, " + ", ".join(parts)


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", s)[:40] or "w"


def render_probes(specs: Sequence[ProbeSpec], files: Path, *, partition: str | None,
                  time_limit_s: float, warmup: int, steps: int,
                  hetsched: str | None = None,
                  gres_names: Mapping[str, str] | None = None,
                  cpus: int = 0) -> list[ProbeOutcome]:
    """Render every probe script (before anything is submitted) into ``files/probes``.

    ``gres_names``: each GPU type as Slurm spells it (GRES types are case-sensitive);
    ``cpus``: CPU cores per GPU where the job does not say (``sbatch_cpus_per_gpu``; 0,
    not said either: the partition's default).
    """
    from hetsched.slurm.templates import render_probe

    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    outs = []
    for sp in specs:
        base = probes_dir(files) / f"{_safe(sp.workload)}-{_safe(sp.gpu_type)}-{stamp}"
        extra = ["--warmup", str(warmup), "--steps", str(steps),
                 "--time-limit", f"{time_limit_s:g}"]
        if sp.entrypoint:
            extra += ["--entrypoint", sp.entrypoint]
        if sp.workdir:
            extra += ["--workdir", sp.workdir]
        script = render_probe(sp.workload, sp.gpu_type, sp.batches, out=f"{base}.csv",
                              log_dir=logs_dir(files), partition=partition, extra_args=extra,
                              time_min=max(1, math.ceil(time_limit_s / 60) + 1),
                              hetsched=hetsched,
                              gres_names=gres_names,
                              cpus=sp.cpus or cpus)
        path = Path(f"{base}.sh")
        atomic_write(path, script.text)
        outs.append(ProbeOutcome(sp, out=Path(f"{base}.csv"), script=path,
                                 logs=logs_dir(files)))
    private_dir(logs_dir(files))
    return outs


#: a step measured this many times slower than a larger batch's was disturbed
DISTURBED = 2.0


def plausible_rows(rows: Sequence[ProfileRow]) -> tuple[list[ProfileRow], list[str]]:
    """A probe's rows less those no step-time curve can pass through: a batch measured
    more than DISTURBED times slower than a larger batch of the same sweep (more work
    cannot take less time; what slowed it was outside the step: other processes at the
    probe's start, a first-use cost). One such row at the smallest batch made the
    planner's monotone curve flat at its mean: 163 ms a step where the job ran 12 ms
    (seen on the testbed). Returns (kept, one line per dropped row)."""
    one = sorted((r for r in rows if r.gpus == 1), key=lambda r: r.local_batch)
    dropped: list[str] = []
    kept: list[ProfileRow] = []
    for i, r in enumerate(one):
        faster = min(one[i + 1:], key=lambda x: x.step_time_s, default=None)
        if (faster is not None and faster.local_batch > r.local_batch
                and r.step_time_s > DISTURBED * faster.step_time_s):
            dropped.append(f"batch {r.local_batch}: {r.step_time_s:.3g} s, slower than batch "
                           f"{faster.local_batch}'s {faster.step_time_s:.3g} s")
        else:
            kept.append(r)
    return kept + [r for r in rows if r.gpus != 1], dropped


def probe_times(store: Store) -> dict[tuple[str, str], float]:
    """Seconds each stored probe ran (for the benchmark's probe cost)."""
    return {k: float(v["probe_s"]) for k, v in statuses(store).items()
            if v.get("probe_s") is not None}


def rows_to_csv_file(rows: Sequence[ProfileRow], path: Path) -> None:
    buf = io.StringIO()
    write_csv(rows, buf)
    atomic_write(path, buf.getvalue())


__all__ = ["table_from_store", "ingest_reports", "plan_probes", "nothing_to_probe",
           "render_probes", "export_csv", "forget", "listing"]
