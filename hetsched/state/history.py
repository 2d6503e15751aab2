"""The profile history (Hare section 3: repeat jobs skip profiling) and the sbatch probes.

* History: the store's ``profiles`` rows, keyed by workload identity (the job
  spec's ``workload`` key, the same key the planner's throughput table uses)
  and GPU type, one row per measured local batch; ``profile_status`` marks a
  pair ``ok`` or ``unusable`` (its probe failed or timed out) so one bad pair
  never fails a batch and is not re-probed at every call.
* :func:`table_from_store` turns the history into the planner's
  :class:`~hetsched.core.throughput.ThroughputTable`.
* :func:`hetsched.app.probe_run.run_probes` submits one short probe job per missing
  (workload, GPU type) through the :class:`~hetsched.slurm.client.SlurmClient` and the probe
  template, all at once (they run concurrently wherever Slurm has GPUs of
  their type), waits with one ``squeue`` per poll, cancels those past their
  time limit, and stores what came back.
* :func:`ingest_reports` refines the history while jobs run: each rank's
  measured compute time per step (report kind ``steps``) moves the stored step
  time of its (workload, GPU type, local batch) by an exponentially weighted
  moving average, ``new = (1 - alpha) * old + alpha * measured``. It also
  keeps the training history ``ones`` predicts progress from (``epoch`` and
  ``done`` records: :mod:`hetsched.state.progress`). Pool executors' ``task`` records
  also fold their ``overhead_s`` (the device's idle time before the task's
  compute) into a per-(workload, GPU type) EWMA (:func:`task_overheads`), which
  :func:`table_from_store` hands to pool planning with the step times.
* Optimizer shares: a row's ``optimizer_s`` (the probe's measure of the
  optimizer step's share of the step) is kept beside the row, in the ``meta``
  table (:mod:`hetsched.state.shares`, keyed workload, GPU type, local batch), and
  rides on the rows :func:`history_rows` returns. A pool task record's
  iteration has no optimizer step (the coordinator steps once per round), so it
  is folded as that iteration plus the pair's optimizer share: the row stays
  the job's whole step, and pool planning takes the share off again.
* Fold weight: a ``steps`` record (a window of a run's steps) moves its row by
  ``alpha``. A pool job's ``task`` records of one read of a report are pooled
  per row (the mean over all their iterations, so a task's fixed costs are
  spread over every iteration, not over a short last task's few) and move the
  row once by ``1 - (1 - alpha) ** k`` for their k iterations, at most
  :data:`MAX_TASK_ALPHA` (k observations of that mean; one read never replaces
  the history outright), so one run of a one-round job moves the step time
  most of the way to what it measured.

Torch-free: the probes run ``hetsched probe`` inside Slurm jobs.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.io.profiles import write_csv
from hetsched.state.overheads import TASK_OVERHEAD_ATTR, fold_overhead, task_overheads
from hetsched.state.progress import fold_progress, run_key
from hetsched.state.shares import (
    OPTIMIZER_KEY,
    fold_weight,
    optimizer_shares,
    pair_optimizer_s,
    read_shares,
    share_of,
    write_shares,
)
from hetsched.state.store import Store

OK = "ok"
UNUSABLE = "unusable"
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
    opt = optimizer_shares(store)
    return [ProfileRow(r["workload"], r["gpu_type"], int(r["local_batch"]),
                       float(r["step_time_s"]), r["sync_time_s"], r.get("max_local_batch"),
                       optimizer_s=share_of(opt, r))
            for r in _rows(store)
            if include_unusable or (r["workload"], r["gpu_type"]) not in bad]


def table_from_store(store: Store) -> ThroughputTable:
    """The planner's throughput source from the profile history; an InputError when
    it has no usable row (never profiled, or every probe failed)."""
    rows = history_rows(store)
    if not rows:  # profiled and every probe failed, or never profiled: say which
        bad = sorted(f"{w}/{g}" for (w, g), s in statuses(store).items() if s["status"] == UNUSABLE)
        why = (f"has no usable profile: every pair probed was marked unusable ({', '.join(bad[:5])}"
               f"{' and more' if len(bad) > 5 else ''}); `hetsched profiles list` says why, "
               "`hetsched profile JOBS.yaml --retry-unusable` probes again") if bad else \
            "is empty; run `hetsched profile JOBS.yaml` or pass --throughputs profiles.csv"
        raise InputError("--throughputs", f"the profile history in {store.path} {why}")
    table = ThroughputTable(rows, source=f"{store.path}:profiles")
    # the pool executor's measured per-task overhead rides on the table (pool planning
    # adds it to every task: planning.pool.problem.PoolProblem.task_overhead_s)
    setattr(table, TASK_OVERHEAD_ATTR, task_overheads(store))  # noqa: B010
    return table


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
    """Store the rows of one GPU's step (:func:`one_gpu_step`); returns how many."""
    n = 0
    pairs: set[tuple[str, str]] = set()
    with store.tx() as c:
        shares = read_shares(c)
        for r in rows:
            if not one_gpu_step(r):
                continue
            store.put_profile(r.workload, r.gpu_type, r.local_batch, r.step_time_s,
                              r.sync_time_s, source, r.max_local_batch)
            # a row replaced without a share does not keep the old row's
            key = (r.workload, r.gpu_type, r.local_batch)
            if r.optimizer_s is None:
                shares.pop(key, None)
            else:
                shares[key] = float(r.optimizer_s)
            pairs.add((r.workload, r.gpu_type))
            n += 1
        write_shares(c, shares)
        for w, g in pairs:
            set_status(store, w, g, OK, source)
    return n


def one_gpu_step(r: ProfileRow) -> bool:
    """Whether ``r`` is one GPU's step, all the history keeps: a row of several GPUs (an
    iteration with its exchange) or of a co-located pair, stored under its (workload, GPU
    type, batch), replaced that batch's step (Gavel's 8-GPU lm row on a K80: 2.7x)."""
    return r.colocated_with is None and r.gpus == 1


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
        g = gpu_type.lower() if gpu_type is not None else None
        write_shares(c, {k: v for k, v in read_shares(c).items()
                          if not ((workload is None or k[0] == workload)
                                  and (g is None or k[1] == g))})
    return int(n)


def forget_all(store: Store) -> int:
    with store.tx() as c:
        n = c.execute("DELETE FROM profiles").rowcount
        c.execute("DELETE FROM profile_status")
        c.execute("DELETE FROM meta WHERE key = ?", (OPTIMIZER_KEY,))
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


def task_as_steps(rec: dict[str, Any], workloads: Mapping[str, str]) -> dict[str, Any] | None:
    """A pool executor's ``task`` record as a ``steps`` record (per-iteration means).

    A task ran ``iterations`` iterations of ``samples / iterations`` samples in
    ``compute_s``; the job's workload comes from its plan (``workloads``).
    """
    try:
        its, samples, compute = int(rec["iterations"]), int(rec["samples"]), \
            float(rec["compute_s"])
        workload = workloads[str(rec["job"])]
    except (KeyError, TypeError, ValueError):
        return None
    if its < 1 or samples < its:
        return None
    return {"kind": "steps", "workload": workload, "gpu_type": rec.get("gpu_type"),
            "local_batch": samples // its, "compute_s": compute / its, "world_size": 1,
            "iterations": its, "pool": True}


def _valid_steps(rec: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """The row a ``steps`` record (or a task record made one) refines; None when unusable."""
    try:
        w, g = str(rec["workload"]), str(rec["gpu_type"]).lower()
        b, meas = int(rec["local_batch"]), float(rec["compute_s"])
    except (KeyError, TypeError, ValueError):
        return None
    if not w or not g or b < 1 or not meas > 0 or not math.isfinite(meas):
        return None
    return w, g, b


def ingest_reports(store: Store, paths: Iterable[str | Path], alpha: float = DEFAULT_ALPHA,
                   workloads: Mapping[str, str] | None = None
                   ) -> list[tuple[str, str, int, float | None, float]]:
    """Fold new ``steps`` records of job reports into the history; returns the changes.

    Each file is read from where the previous call stopped (``report_offsets``),
    so calling this from every monitor cycle counts each measurement once.
    With ``workloads`` (job -> workload), pool executors' ``task`` records
    count too (:func:`task_as_steps`): pooled per row over the read, as the mean
    iteration plus the row's optimizer share, weighted by :func:`fold_weight` of
    their iterations (the module docstring).
    """
    from hetsched.io.reports import read_reports

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
        shares = read_shares(c)
        for path in paths:
            key_path = str(Path(path).resolve())
            row = c.execute("SELECT offset FROM report_offsets WHERE path = ?",
                            (key_path,)).fetchone()
            recs, new_off = read_reports(path, int(row[0]) if row else 0)
            # a pool job's task records of this read, pooled per row: their iterations'
            # mean (a task's fixed costs spread over all of them, not over a short last
            # task's few), folded once with the weight of all those iterations
            pooled: dict[tuple[str, str, int], list[float]] = {}
            steps: list[dict[str, Any]] = []
            for rec in recs:
                if rec.get("kind") in ("epoch", "done"):
                    fold_progress(c, run_key(key_path, str(rec.get("job", ""))), rec)
                    continue
                if rec.get("kind") == "task" and workloads is not None:
                    fold_overhead(c, rec, workloads, alpha)
                    rec = task_as_steps(rec, workloads) or {}
                    ok = _valid_steps(rec)
                    if ok is not None:
                        acc = pooled.setdefault(ok, [0.0, 0.0])
                        acc[0] += float(rec["compute_s"]) * int(rec["iterations"])
                        acc[1] += int(rec["iterations"])
                    continue
                if rec.get("kind") == "steps" and _valid_steps(rec) is not None:
                    steps.append(rec)
            steps += [{"workload": w, "gpu_type": g, "local_batch": b, "compute_s": tot / its,
                       "iterations": int(its), "pool": True, "world_size": 1}
                      for (w, g, b), (tot, its) in pooled.items()]
            for rec in steps:
                changes.append(_fold_step(store, current, caps, shares, rec, alpha,
                                          f"ewma:{Path(path).name}"))
            c.execute("INSERT OR REPLACE INTO report_offsets VALUES (?,?,?)",
                      (key_path, new_off, time.time()))
    return changes


def _fold_step(store: Store, current: dict[tuple[str, str, int], dict[str, Any]],
               caps: Mapping[tuple[str, str], int], shares: Mapping[tuple[str, str, int], float],
               rec: Mapping[str, Any], alpha: float, source: str
               ) -> tuple[str, str, int, float | None, float]:
    """One measured step (a ``steps`` record, or a row's pooled task records) into its
    row: stored, ``current`` updated; returns the change (row, old, new step time)."""
    w, g = str(rec["workload"]), str(rec["gpu_type"]).lower()
    b, meas = int(rec["local_batch"]), float(rec["compute_s"])
    sync = rec.get("sync_s")
    key = (w, g, b)
    old = current.get(key)
    weight = alpha
    if rec.get("pool"):
        # the executor's iteration has no optimizer step: the row is the whole step
        share = shares.get(key)
        meas += share if share is not None else (pair_optimizer_s(shares, w, g)
                                                 or 0.0)
        weight = fold_weight(alpha, int(rec.get("iterations") or 1))
    new: dict[str, Any]
    change: tuple[str, str, int, float | None, float]
    if old is None:
        new = {"workload": w, "gpu_type": g, "local_batch": b, "step_time_s": meas,
               "sync_time_s": sync if rec.get("world_size", 1) > 1 else None,
               "max_local_batch": caps.get((w, g)), "samples": 1}
        change = (w, g, b, None, meas)
    else:
        est = (1 - weight) * float(old["step_time_s"]) + weight * meas
        osync = old.get("sync_time_s")
        if isinstance(sync, (int, float)) and rec.get("world_size", 1) > 1:
            osync = sync if osync is None else (1 - alpha) * osync + alpha * sync
        change = (w, g, b, float(old["step_time_s"]), est)
        new = {**old, "step_time_s": est, "sync_time_s": osync,
               "samples": int(old.get("samples") or 1) + 1}
    current[key] = new
    store.put_profile(w, g, b, float(new["step_time_s"]), new["sync_time_s"],
                      source, new.get("max_local_batch"),
                      int(new["samples"]))
    return change
