"""The training history ``ones`` predicts progress from (schema version 3).

Rank 0's ``epoch`` records and a completed run's ``done`` record are folded in
by :func:`fold_progress` (called by ``state.history.ingest_reports`` as it reads
the reports): tables ``progress_runs`` and ``progress_epochs``.
:func:`progress_points` turns completed jobs' epochs into the regression's
training points (docs/elastic.md); :func:`epochs_reported` gives running jobs'
measured epochs (replan's ``epochs_done``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetsched.core.efficiency import features
from hetsched.state.store import Store


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def fold_progress(c: Any, run: str, rec: dict[str, Any]) -> None:
    """One rank-0 ``epoch`` record or a completed run's ``done`` record into the history."""
    if int(rec.get("rank") or 0) != 0:
        return
    now = time.time()
    if rec["kind"] == "epoch":
        size = _num(rec.get("dataset_size"))
        epoch = rec.get("epoch")
        if size is None or size <= 0 or not isinstance(epoch, int) or epoch < 0:
            return
        c.execute("INSERT OR IGNORE INTO progress_runs (run, job, workload) VALUES (?,?,?)",
                  (run, str(rec.get("job", "")), str(rec.get("workload") or "")))
        c.execute("UPDATE progress_runs SET initial_loss = ? WHERE run = ? AND "
                  "initial_loss IS NULL", (_num(rec.get("first_loss")), run))
        c.execute("INSERT OR REPLACE INTO progress_epochs VALUES (?,?,?,?,?)",
                  (run, epoch, size, _num(rec.get("loss")), now))
    elif rec.get("reason") is None:  # done, not stopped: the run's length is now known
        n = c.execute("SELECT COUNT(*) FROM progress_epochs WHERE run = ?", (run,)).fetchone()[0]
        if n:
            c.execute("UPDATE progress_runs SET epochs = ?, finished = ? WHERE run = ?",
                      (int(n), now, run))


def progress_points(store: Store) -> tuple[np.ndarray, np.ndarray]:
    """(features, progress) of every epoch of every completed run: ONES's training set.

    The progress after epoch k (counted from 1) of a run that finished E epochs
    is k / E; the features are :func:`hetsched.core.efficiency.features`
    (epoch size, the run's initial loss, epochs done, loss improvement ratio).
    A file of schema version 2 opened read-only has no history: none.
    """
    if not store.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'progress_runs'"
                              ).fetchone():
        return np.zeros((0, 5)), np.zeros(0)
    rows = store.conn.execute(
        "SELECT r.epochs, r.initial_loss, e.epoch, e.dataset_size, e.loss "
        "FROM progress_runs r JOIN progress_epochs e ON e.run = r.run "
        "WHERE r.epochs IS NOT NULL ORDER BY r.run, e.epoch").fetchall()
    if not rows:
        return np.zeros((0, 5)), np.zeros(0)
    X = np.array([features(r[3], r[2] + 1, r[1], r[4]) for r in rows])
    y = np.array([min(1.0, (r[2] + 1) / r[0]) for r in rows])
    return X, y


def completed_runs(store: Store) -> int:
    """How many completed runs the progress history holds."""
    return int(store.conn.execute(
        "SELECT COUNT(*) FROM progress_runs WHERE epochs IS NOT NULL").fetchone()[0])


def run_key(report: str | Path, job: str) -> str:
    """The progress history's key of one run: its report file (resolved) and its job.
    A batch's job has its own report file, so a later batch reusing the name is
    another run."""
    return f"{Path(report).resolve()}:{job}"


def epochs_reported(store: Store) -> dict[str, int]:
    """Per unfinished run (:func:`run_key`), the epochs it has reported (its highest
    epoch + 1).

    A resumed run counts on from its checkpoint's epoch into the same report
    file, so this is the job's total since it first started, however often it
    was moved or replanned; replan takes it over its own estimate. Completed
    runs are left out, and another batch's run of the same name is another key.
    """
    if not store.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'progress_runs'"
                              ).fetchone():
        return {}
    rows = store.conn.execute(
        "SELECT r.run, MAX(e.epoch) FROM progress_runs r JOIN progress_epochs e "
        "ON e.run = r.run WHERE r.epochs IS NULL AND r.job != '' GROUP BY r.run").fetchall()
    return {str(run): int(top) + 1 for run, top in rows}
