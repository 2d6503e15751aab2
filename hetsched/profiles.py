"""The profile history (Hare section 3: repeat jobs skip profiling) and the sbatch probes.

* History: the store's ``profiles`` rows, keyed by workload identity (the job
  spec's ``workload`` key, the same key the planner's throughput table uses)
  and GPU type, one row per measured local batch; ``profile_status`` marks a
  pair ``ok`` or ``unusable`` (its probe failed or timed out) so one bad pair
  never fails a batch and is not re-probed at every call.
* :func:`table_from_store` turns the history into the planner's
  :class:`~hetsched.throughput.ThroughputTable`.
* :func:`run_probes` submits one short probe job per missing (workload, GPU
  type) through the :class:`~hetsched.slurm.client.SlurmClient` and the probe
  template, all at once (they run concurrently wherever Slurm has GPUs of
  their type), waits with one ``squeue`` per poll, cancels those past their
  time limit, and stores what came back.
* :func:`ingest_reports` refines the history while jobs run: each rank's
  measured compute time per step (report kind ``steps``) moves the stored step
  time of its (workload, GPU type, local batch) by an exponentially weighted
  moving average, ``new = (1 - alpha) * old + alpha * measured``.

Torch-free: the probes run ``hetsched probe`` inside Slurm jobs.
"""

from __future__ import annotations

import io
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched.errors import InputError
from hetsched.fileio import atomic_write
from hetsched.spec import Job
from hetsched.store import Store
from hetsched.throughput import ProfileRow, ThroughputTable, parse_csv, write_csv

OK = "ok"
UNUSABLE = "unusable"
#: workloads the runtime can build without an entrypoint (hetsched.runtime.workloads)
BUILTIN_WORKLOADS = frozenset({"mlp", "cnn", "transformer", "tiny-transformer"})
DEFAULT_ALPHA = 0.3


# ---------------------------------------------------------------------------
# history


def _rows(store: Store) -> list[dict[str, Any]]:
    return store.profiles()


def statuses(store: Store) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["workload"], r["gpu_type"]): dict(r) for r in store.conn.execute(
        "SELECT * FROM profile_status")}


def set_status(store: Store, workload: str, gpu_type: str, status: str, reason: str = "",
               slurm_id: str | None = None, probe_s: float | None = None) -> None:
    with store.tx() as c:
        c.execute("INSERT OR REPLACE INTO profile_status VALUES (?,?,?,?,?,?,?)",
                  (workload, gpu_type, status, reason, slurm_id, probe_s, time.time()))


def history_rows(store: Store, include_unusable: bool = False) -> list[ProfileRow]:
    """The stored profile rows as planner rows (unusable pairs left out)."""
    bad = {k for k, s in statuses(store).items() if s["status"] == UNUSABLE}
    return [ProfileRow(r["workload"], r["gpu_type"], int(r["local_batch"]),
                       float(r["step_time_s"]), r["sync_time_s"], r.get("max_local_batch"))
            for r in _rows(store)
            if include_unusable or (r["workload"], r["gpu_type"]) not in bad]


def table_from_store(store: Store) -> ThroughputTable:
    """The planner's throughput source from the profile history.

    Raises InputError when the history is empty (run ``hetsched profile`` or
    give a CSV).
    """
    rows = history_rows(store)
    if not rows:
        raise InputError("--throughputs", f"the profile history in {store.path} is empty; run "
                         "`hetsched profile JOBS.yaml` or pass --throughputs profiles.csv")
    return ThroughputTable(rows, source=f"{store.path}:profiles")


def usable_pairs(store: Store) -> set[tuple[str, str]]:
    return {(r.workload, r.gpu_type) for r in history_rows(store)}


def export_csv(store: Store, workload: str | None = None, gpu_type: str | None = None) -> str:
    rows = [r for r in history_rows(store)
            if (workload is None or r.workload == workload)
            and (gpu_type is None or r.gpu_type == gpu_type)]
    buf = io.StringIO()
    write_csv(rows, buf)
    return buf.getvalue()


def import_rows(store: Store, rows: Iterable[ProfileRow], source: str) -> int:
    n = 0
    pairs: set[tuple[str, str]] = set()
    with store.tx():
        for r in rows:
            store.put_profile(r.workload, r.gpu_type, r.local_batch, r.step_time_s,
                              r.sync_time_s, source, r.max_local_batch)
            pairs.add((r.workload, r.gpu_type))
            n += 1
        for w, g in pairs:
            set_status(store, w, g, OK, source)
    return n


def forget(store: Store, workload: str | None = None, gpu_type: str | None = None) -> int:
    """Delete history rows (and probe status) matching the filters; returns rows deleted."""
    if workload is None and gpu_type is None:
        raise InputError("profiles forget", "give --workload and/or --gpu-type (or --all)")
    conds, args = [], []
    if workload is not None:
        conds.append("workload = ?")
        args.append(workload)
    if gpu_type is not None:
        conds.append("gpu_type = ?")
        args.append(gpu_type.lower())
    where = " AND ".join(conds)
    with store.tx() as c:
        n = c.execute(f"DELETE FROM profiles WHERE {where}", args).rowcount  # noqa: S608 - fixed columns
        c.execute(f"DELETE FROM profile_status WHERE {where}", args)  # noqa: S608
    return int(n)


def forget_all(store: Store) -> int:
    with store.tx() as c:
        n = c.execute("DELETE FROM profiles").rowcount
        c.execute("DELETE FROM profile_status")
    return int(n)


def listing(store: Store) -> list[dict[str, Any]]:
    """One entry per (workload, GPU type): batches, fit, status, source, age."""
    st = statuses(store)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in _rows(store):
        groups.setdefault((r["workload"], r["gpu_type"]), []).append(r)
    out = []
    table = ThroughputTable(history_rows(store, include_unusable=True)) if groups else None
    for key in sorted(set(groups) | set(st)):
        rs = groups.get(key, [])
        fit = table.get(*key) if table else None
        s = st.get(key, {})
        out.append({
            "workload": key[0], "gpu_type": key[1],
            "status": s.get("status", OK if rs else "-"), "reason": s.get("reason", ""),
            "batches": [int(r["local_batch"]) for r in rs],
            "samples": sum(int(r.get("samples") or 1) for r in rs),
            "a_s": fit.a if fit else None, "c_s": fit.c if fit else None,
            "max_batch": fit.max_batch if fit else None,
            "peak_samples_per_s": fit.peak_throughput if fit else None,
            "sources": sorted({str(r["source"]).split(":")[0] for r in rs}),
            "updated": max((float(r["updated"]) for r in rs), default=s.get("updated")),
            "probe_s": s.get("probe_s"),
        })
    return out


# ---------------------------------------------------------------------------
# EWMA refinement from running jobs' reports


def ingest_reports(store: Store, paths: Iterable[str | Path], alpha: float = DEFAULT_ALPHA
                   ) -> list[tuple[str, str, int, float | None, float]]:
    """Fold new ``steps`` records of job reports into the history; returns the changes.

    Each file is read from where the previous call stopped (``report_offsets``),
    so calling this from every monitor cycle counts each measurement once.
    """
    from hetsched.runtime.reporting import read_reports

    if not 0 < alpha <= 1:
        raise InputError("--alpha", f"{alpha} must be in (0, 1]")
    changes: list[tuple[str, str, int, float | None, float]] = []
    current = {(r["workload"], r["gpu_type"], int(r["local_batch"])): dict(r)
               for r in _rows(store)}
    caps: dict[tuple[str, str], int] = {}
    for r in current.values():
        if r.get("max_local_batch"):
            caps[(r["workload"], r["gpu_type"])] = int(r["max_local_batch"])
    with store.tx() as c:
        for path in paths:
            key_path = str(Path(path).resolve())
            row = c.execute("SELECT offset FROM report_offsets WHERE path = ?",
                            (key_path,)).fetchone()
            recs, new_off = read_reports(path, int(row[0]) if row else 0)
            for rec in recs:
                if rec.get("kind") != "steps":
                    continue
                try:
                    w, g = str(rec["workload"]), str(rec["gpu_type"]).lower()
                    b, meas = int(rec["local_batch"]), float(rec["compute_s"])
                except (KeyError, TypeError, ValueError):
                    continue
                if not w or not g or b < 1 or not meas > 0 or not math.isfinite(meas):
                    continue
                sync = rec.get("sync_s")
                key = (w, g, b)
                old = current.get(key)
                new: dict[str, Any]
                if old is None:
                    new = {"workload": w, "gpu_type": g, "local_batch": b, "step_time_s": meas,
                           "sync_time_s": sync if rec.get("world_size", 1) > 1 else None,
                           "max_local_batch": caps.get((w, g)), "samples": 1}
                    changes.append((w, g, b, None, meas))
                else:
                    est = (1 - alpha) * float(old["step_time_s"]) + alpha * meas
                    osync = old.get("sync_time_s")
                    if isinstance(sync, (int, float)) and rec.get("world_size", 1) > 1:
                        osync = sync if osync is None else (1 - alpha) * osync + alpha * sync
                    changes.append((w, g, b, float(old["step_time_s"]), est))
                    new = {**old, "step_time_s": est, "sync_time_s": osync,
                           "samples": int(old.get("samples") or 1) + 1}
                current[key] = new
                store.put_profile(w, g, b, float(new["step_time_s"]), new["sync_time_s"],
                                  f"ewma:{Path(path).name}", new.get("max_local_batch"),
                                  int(new["samples"]))
            c.execute("INSERT OR REPLACE INTO report_offsets VALUES (?,?,?)",
                      (key_path, new_off, time.time()))
    return changes


# ---------------------------------------------------------------------------
# probes


@dataclass(frozen=True)
class ProbeSpec:
    workload: str
    gpu_type: str
    batches: tuple[int, ...]
    entrypoint: str | None = None


@dataclass
class ProbeOutcome:
    spec: ProbeSpec
    status: str = "pending"  # pending | ok | unusable
    slurm_id: str | None = None
    reason: str = ""
    rows: list[ProfileRow] = field(default_factory=list)
    out: Path | None = None
    script: Path | None = None
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
                retry_unusable: bool = False) -> tuple[list[ProbeSpec], dict[str, str]]:
    """Which (workload, GPU type) pairs need a probe; and why the others do not."""
    have = usable_pairs(store) if store is not None else set()
    st = statuses(store) if store is not None else {}
    specs: dict[tuple[str, str], ProbeSpec] = {}
    skipped: dict[str, str] = {}
    types = sorted({g.lower() for g in gpu_types})
    for job in jobs:
        allowed = [g for g in types if job.gpu_types is None or g in job.gpu_types]
        for g in allowed:
            key = (job.workload, g)
            label = f"{job.workload}/{g}"
            if key in specs:
                continue
            if not force and key in have:
                skipped[label] = "history"
                continue
            if not force and not retry_unusable and st.get(key, {}).get("status") == UNUSABLE:
                skipped[label] = f"unusable ({st[key].get('reason') or 'probe failed'})"
                continue
            if job.entrypoint is None and job.workload not in BUILTIN_WORKLOADS:
                skipped[label] = (f"job {job.name!r} has no entrypoint and {job.workload!r} is "
                                  "not a built-in workload: nothing to probe (import a CSV with "
                                  "`hetsched profiles import`)")
                continue
            specs[key] = ProbeSpec(job.workload, g, tuple(batches) if batches else
                                   default_batches(job.global_batch), job.entrypoint)
    return list(specs.values()), skipped


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", s)[:40] or "w"


def render_probes(specs: Sequence[ProbeSpec], files: Path, *, partition: str | None,
                  time_limit_s: float, warmup: int, steps: int,
                  hetsched: str | None = None) -> list[ProbeOutcome]:
    """Render every probe script (before anything is submitted) into ``files/probes``."""
    from hetsched.slurm.templates import render_probe

    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    outs = []
    for sp in specs:
        base = files / "probes" / f"{_safe(sp.workload)}-{_safe(sp.gpu_type)}-{stamp}"
        extra = ["--warmup", str(warmup), "--steps", str(steps),
                 "--time-limit", f"{time_limit_s:g}"]
        if sp.entrypoint:
            extra += ["--entrypoint", sp.entrypoint]
        script = render_probe(sp.workload, sp.gpu_type, sp.batches, out=f"{base}.csv",
                              log_dir=files / "logs", partition=partition, extra_args=extra,
                              time_min=max(1, math.ceil(time_limit_s / 60) + 1),
                              hetsched=hetsched)
        path = Path(f"{base}.sh")
        atomic_write(path, script.text)
        outs.append(ProbeOutcome(sp, out=Path(f"{base}.csv"), script=path))
    (files / "logs").mkdir(parents=True, exist_ok=True)
    return outs


def run_probes(outcomes: list[ProbeOutcome], client: Any, store: Store, *,
               time_limit_s: float, queue_wait_s: float = 120.0, poll_s: float = 1.0,
               grace_s: float = 15.0,
               progress: Callable[[str], None] | None = None) -> list[ProbeOutcome]:
    """Submit every probe, wait for all (one squeue per poll), store the results.

    A probe that fails to submit, fails, runs past ``time_limit_s`` or waits in
    the queue longer than ``queue_wait_s`` marks its pair unusable; the others
    carry on. ``grace_s`` beyond the time limit covers the probe's start-up
    (importing torch) before its own ``--time-limit`` clock starts.
    """
    say = progress or (lambda m: None)
    for o in outcomes:
        try:
            o.slurm_id = client.submit(str(o.script))
            o.submitted_at = time.monotonic()
            say(f"probe {o.spec.workload} on {o.spec.gpu_type}: Slurm job {o.slurm_id}")
        except Exception as e:  # noqa: BLE001 - any sbatch failure only loses this pair
            o.status, o.reason = UNUSABLE, f"sbatch failed: {e}"
    pending = [o for o in outcomes if o.status == "pending"]
    while pending:
        time.sleep(poll_s)
        jobs = {j.job_id: j for j in client.jobs()}
        now = time.monotonic()
        for o in list(pending):
            j = jobs.get(str(o.slurm_id))
            if j is not None and not j.finished:
                if j.state == "RUNNING" and o.started_at is None:
                    o.started_at = now
                late_run = (o.started_at is not None
                            and now - o.started_at > time_limit_s + grace_s)
                late_queue = o.started_at is None and now - o.submitted_at > queue_wait_s
                if late_run or late_queue:
                    client.cancel([str(o.slurm_id)])
                    o.status = UNUSABLE
                    o.reason = (f"timed out after {time_limit_s:g} s" if late_run else
                                f"still {j.state.lower()} after {queue_wait_s:g} s in the queue"
                                f" ({j.reason or 'no reason given'})")
                    pending.remove(o)
                continue
            pending.remove(o)  # finished, or gone from squeue: the output file tells
            o.seconds = now - (o.started_at or o.submitted_at)
            _collect(o, j.state if j is not None else "GONE")
    for o in outcomes:
        if o.status == "ok":
            import_rows(store, o.rows, f"probe:{o.slurm_id}")
            set_status(store, o.spec.workload, o.spec.gpu_type, OK, f"probe:{o.slurm_id}",
                       o.slurm_id, o.seconds)
        else:
            set_status(store, o.spec.workload, o.spec.gpu_type, UNUSABLE, o.reason, o.slurm_id,
                       o.seconds)
        say(f"probe {o.spec.workload} on {o.spec.gpu_type}: {o.status}"
            + (f" ({o.reason})" if o.reason else f", {len(o.rows)} rows"))
    return outcomes


def _collect(o: ProbeOutcome, state: str) -> None:
    assert o.out is not None
    try:
        text = o.out.read_text()
        rows = parse_csv(text, str(o.out))
    except (OSError, InputError) as e:
        o.status = UNUSABLE
        o.reason = f"probe job ended {state} without results ({e})"
        return
    rows = [r for r in rows
            if r.workload == o.spec.workload and r.gpu_type == o.spec.gpu_type]
    if not rows:
        o.status, o.reason = UNUSABLE, f"probe job ended {state} with no rows for this pair"
        return
    o.status, o.rows = OK, rows


def probe_times(store: Store) -> dict[tuple[str, str], float]:
    """Seconds each stored probe ran (for the benchmark's probe cost)."""
    return {k: float(v["probe_s"]) for k, v in statuses(store).items()
            if v.get("probe_s") is not None}


def rows_to_csv_file(rows: Sequence[ProfileRow], path: Path) -> None:
    buf = io.StringIO()
    write_csv(rows, buf)
    atomic_write(path, buf.getvalue())


__all__ = ["table_from_store", "ingest_reports", "plan_probes", "render_probes", "run_probes",
           "export_csv", "forget", "listing"]
