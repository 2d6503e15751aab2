"""ONES's remaining-work distributions: history of completed jobs -> Beta progress per job.

Completed jobs' histories are the runtime's report files (JSON lines, the
files ``hetsched monitor`` ingests into the state store): every ``epoch``
record of a job that reported ``done`` gives one training point
(features after k epochs, progress k / E). :class:`Remaining` then draws
each active job's remaining work:

* a job with known ``epochs``: its exact remaining iterations (a Beta at the
  known progress would only add noise, so none is drawn);
* a ``target_loss`` job (``epochs_predicted``): Beta progress from the
  fitted :class:`~hetsched.core.efficiency.ProgressModel`, ONES eq. 7.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from hetsched.core.efficiency import ProgressModel, features, sample_remaining
from hetsched.core.problem import PlanningProblem
from hetsched.io.reports import iter_records


def history_points(paths: Iterable[str | Path]) -> tuple[np.ndarray, np.ndarray]:
    """(features, progress) pairs from completed jobs' report files (or directories of them)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    X, y = [], []
    for f in files:
        if not any(r.get("reason") is None for r in iter_records(f, "done")):
            continue  # unfinished: its total length is unknown
        epochs = [r for r in iter_records(f, "epoch") if r.get("rank", 0) == 0]
        E = len(epochs)
        for k, r in enumerate(epochs, start=1):
            size = float(r.get("dataset_size") or r.get("samples_per_s", 0) * r.get("time_s", 0))
            X.append(features(size, k, r.get("first_loss"), r.get("loss")))
            y.append(k / E)
    if not X:
        return np.zeros((0, 5)), np.zeros(0)
    return np.array(X), np.array(y)


def fit_history(paths: Iterable[str | Path], seed: int = 0) -> ProgressModel:
    X, y = history_points(paths)
    return ProgressModel().fit(X, y, seed=seed)


class Remaining:
    """Draws of remaining work (iterations at the spec's batch) per job row."""

    def __init__(self, p: PlanningProblem, model: ProgressModel | None) -> None:
        self.p = p
        self.model = model

    def draw(self, rng: np.random.Generator, jobs: np.ndarray, remaining: np.ndarray,
             n: int) -> np.ndarray:
        """(n, len(jobs)) draws; a known-length job's column is its exact remaining work."""
        out = np.repeat(remaining[None, :].astype(float), n, axis=0)
        if self.model is None:
            return out
        for r, i in enumerate(jobs):
            job = self.p.jobs[int(i)]
            if not job.epochs_predicted:
                continue
            spe = job.steps_per_epoch
            done_iters = float(self.p.iters[int(i)] - remaining[r])
            a, b = self.model.beta(features(job.dataset_size, done_iters / spe))
            out[:, r] = sample_remaining(rng, a, b, done_iters, float(remaining[r]), n)
        return out
