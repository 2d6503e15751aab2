"""Planned length of ``target_loss`` jobs: the progress predictor's, for every policy.

A job with ``target_loss`` and no ``epochs`` is read with the prior
(``PRIOR_EPOCHS``, ``epochs_predicted: true``; hetsched/io/specs.py). When
completed jobs' history fits a :class:`~hetsched.core.efficiency.ProgressModel`
(``fit_history``: at least ``MIN_POINTS`` points), :func:`predict_lengths`
replaces that prior by the model's expected length *before* the
``PlanningProblem`` is built, so every policy, both modes and the evaluator
plan the same number (docs/elastic.md):

* a job that has run ``k >= 1`` epochs (replan): the expected total is
  ``k / p`` with ``p`` the mean progress after ``k`` epochs (ONES eq. 7), so
  it plans ``k / p - k`` epochs left;
* a new job, or one under its first epoch: the expected total is ``1 / p1``,
  ``p1`` the mean progress the model gives after one epoch (eq. 7 has nothing
  to extrapolate from before it), its not-yet-known losses taken as the
  history's mean at the first epoch; it plans that total less ``k``.

Jobs with known ``epochs`` are never touched; without a fitted model nothing
changes. The history comes in as data (planning never opens the store).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping

import numpy as np

from hetsched.core import limits
from hetsched.core.efficiency import ProgressModel, features
from hetsched.core.spec import Job
from hetsched.planning.space.policies.ones_predict import fit_history


def expected_total_epochs(model: ProgressModel, dataset_size: float, done: float,
                          first_epoch: np.ndarray | None = None) -> float:
    """The model's expected total epochs of a job that has run ``done`` epochs.

    Under one epoch (the history starts at one; eq. 7 from a fraction of an epoch
    would plan almost nothing): ``1 / p1`` at one epoch, the losses not yet known
    taken from ``first_epoch`` (the history's mean first-epoch features) if given.
    """
    if done >= 1.0:
        a, b = model.beta(features(dataset_size, done))
        return done / (a / (a + b))
    x = features(dataset_size, 1.0)
    if first_epoch is not None:
        x[[1, 3]] = first_epoch[[1, 3]]
    a, b = model.beta(x)
    return max(done, 1.0 / (a / (a + b)))


def _first_epoch(history: tuple[np.ndarray, np.ndarray]) -> np.ndarray | None:
    """Mean features of the history's first-epoch points (NaN where unknown)."""
    X = np.asarray(history[0], dtype=float)
    first = X[np.isclose(X[:, 2], np.log1p(1.0))]
    if not len(first):
        return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(first, axis=0)


def predict_lengths(jobs: list[Job], history: tuple[np.ndarray, np.ndarray] | None,
                    epochs_done: Mapping[str, float] | None = None, seed: int = 0
                    ) -> tuple[list[Job], dict[str, object] | None]:
    """``jobs`` with each predicted-length job planned at the model's expectation.

    ``epochs_done``: job name -> epochs it has already run (replan). Returns the
    jobs and, when a model was fitted and some job was predicted, the record the
    plan keeps in ``Plan.notes.length_prediction`` (history points, per job the
    planned epochs left and the expected total); else ``(jobs, None)``.
    """
    if not any(j.epochs_predicted and j.target_loss is not None for j in jobs):
        return jobs, None
    model = fit_history(history, seed)
    if model is None:
        return jobs, None
    done = dict(epochs_done or {})
    first = _first_epoch(history) if history is not None else None
    hi = limits.JOB["epochs"].maximum
    out: list[Job] = []
    per_job: dict[str, dict[str, float]] = {}
    for job in jobs:
        if not (job.epochs_predicted and job.target_loss is not None):
            out.append(job)
            continue
        k = max(0.0, float(done.get(job.name, 0.0)))
        total = min(expected_total_epochs(model, job.dataset_size, k, first), hi)
        left = min(max(total - k, 1e-3), hi)
        per_job[job.name] = {"epochs_done": round(k, 6), "expected_total": round(total, 6),
                             "epochs_planned": round(left, 6)}
        out.append(dataclasses.replace(job, epochs=left))
    return out, {"predictor_points": model.n_train, "jobs": per_job}
