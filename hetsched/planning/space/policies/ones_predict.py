"""ONES's remaining-work distributions: completed jobs' history -> Beta progress per job.

The history is the state store's (``hetsched.state.progress.progress_points``:
every epoch of every completed run, features after k epochs and progress
k / E), handed to the planner as ``PlanningProblem.progress_history`` by the
CLI and by replan (planning never opens the store). :class:`Remaining` then
draws each active job's remaining work:

* a job with known ``epochs``: its exact remaining iterations (a Beta at the
  known progress would only add noise, so none is drawn);
* a ``target_loss`` job (``epochs_predicted``): Beta progress from the
  fitted :class:`~hetsched.core.efficiency.ProgressModel` (a Beta regression
  by maximum likelihood with scipy.optimize), ONES eq. 7.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.efficiency import ProgressModel, features, sample_remaining
from hetsched.core.problem import PlanningProblem

#: fewest training points the regression is fitted on (fewer: no predictor, the prior)
MIN_POINTS = 3


def fit_history(history: tuple[np.ndarray, np.ndarray] | None, seed: int = 0
                ) -> ProgressModel | None:
    """The fitted predictor, or None without enough history."""
    if history is None or len(history[1]) < MIN_POINTS:
        return None
    X, y = history
    return ProgressModel().fit(np.asarray(X, dtype=float), np.asarray(y, dtype=float),
                               seed=seed)


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
