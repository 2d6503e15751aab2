"""The time grid of the joint LP bound (:mod:`.lp_bound`): its interval boundaries, and
each job's window of bounded intervals.

Boundaries are placed where the jobs are in the system (quantiles of points
between each job's arrival and a few times its estimated stay), and each job
has columns only from its arrival's interval to the end of its window, then
one unbounded tail. Any grid and any windows keep the bound valid; a finer
grid where the jobs run tightens it.
"""

from __future__ import annotations

import numpy as np

#: where after a job's arrival the activity grid puts points: multiples of its estimated
#: stay from ``SPREAD[0]`` (or 1 / the points per job, if more) to ``SPREAD[1]``
#: (geometric), and the arrival itself
SPREAD = (1 / 32, 4.0)


def activity_grid(a: np.ndarray, span: np.ndarray, t0: float, t1: float, n: int) -> np.ndarray:
    """About ``n`` interval boundaries from ``t0`` to ``t1``, dense where jobs run.

    ``span[i]``: an estimate of how long job i is in the system. The boundaries
    are quantiles of the points ``a_i + f span_i`` (``f`` 0 and geometric over ``SPREAD``), so
    the grid is fine where many jobs arrive and run, coarse where few do,
    whatever the arrivals' spread (a geometric grid from the first arrival is
    fine only at the start). Any grid keeps the LP valid.
    """
    m = max(10, 2 * n // max(len(a), 1))  # points per job: a fine grid for few jobs too
    f = np.concatenate([[0.0], np.geomspace(max(SPREAD[0], 1.0 / m), SPREAD[1], m - 1)])
    pts = (a[:, None] + f[None, :] * span[:, None]).ravel()
    pts = np.clip(pts, t0, t1)
    q = np.quantile(pts, np.linspace(0.0, 1.0, max(n, 1) + 1), method="lower")
    arr = np.unique(a)
    if len(arr) > n // 2:  # arrivals as boundaries too while they are few
        arr = arr[:0]
    return np.unique(np.concatenate([[t0], q, arr, [t1]]))


def windows(bnd: np.ndarray, a: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per job, the interval holding its arrival and the index of the boundary that opens
    its unbounded tail: the first boundary at or after ``end_i`` (at least one interval
    after the arrival's; at most the last boundary)."""
    K = len(bnd) - 1
    first = np.clip(np.searchsorted(bnd, a, side="right") - 1, 0, K)
    last = np.clip(np.searchsorted(bnd, end, side="left"), first + 1, K)
    return first, np.minimum(last, K)


def columns(n_conf: np.ndarray, first: np.ndarray, last: np.ndarray) -> int:
    """LP columns of the windowed LP: per job, its configurations in every interval from
    its arrival's to its tail (included)."""
    return int((n_conf * (last - first + 1)).sum())
