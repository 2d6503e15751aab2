"""The time grid of the joint LP bound (:mod:`.lp_bound`): its interval boundaries.

Geometric steps from a first interval of a fraction of the shortest job, plus
the jobs' arrival times, coarsened (fewer steps, then fewer arrival
boundaries) until the LP's columns fit its size limit. A coarser grid only
loosens the bound: it stays valid.
"""

from __future__ import annotations

import numpy as np


def grid(arrivals: np.ndarray, t0: float, t1: float, first: float, n: int,
         max_arrivals: int | None = None) -> np.ndarray:
    """``n`` interval boundaries from ``t0`` to ``t1``: geometric steps from ``first``, plus arrivals.

    Uniform when ``n`` steps of ``first`` already span the horizon. With
    ``max_arrivals``, only that many arrival times (evenly spread over the
    sorted distinct ones) become boundaries: a job arriving inside an
    interval may only use the part after its arrival (``lp_bound._build``),
    so fewer boundaries loosen the bound but keep it valid.
    """
    arr = np.unique(arrivals[arrivals > t0])
    if max_arrivals is not None and len(arr) > max_arrivals:
        arr = arr[np.unique(np.linspace(0, len(arr) - 1, max(max_arrivals, 0)).astype(int))] \
            if max_arrivals > 0 else arr[:0]
    arrivals = arr
    span = max(t1 - t0, first)
    n = max(n, 1)
    if n * first >= span:
        pts: np.ndarray = t0 + span * np.arange(n + 1) / n
    else:  # first * ((1+g)^n - 1) / g = span, solved for the growth g by bisection
        lo, hi = 0.0, 1.0
        while first * ((1 + hi) ** n - 1) / hi < span:
            hi *= 2.0
        for _ in range(60):
            g = 0.5 * (lo + hi)
            if g > 0 and first * ((1 + g) ** n - 1) / g >= span:
                hi = g
            else:
                lo = g
        pts = t0 + first * ((1 + hi) ** np.arange(n + 1) - 1) / hi
    return np.unique(np.concatenate([pts, arrivals]))


def fitting_grid(a: np.ndarray, t0: float, t1: float, first: float, n: int,
                 n_conf: int, max_vars: int, min_intervals: int) -> np.ndarray | None:
    """The finest geometric grid (halving ``n``, then thinning the arrival boundaries)
    whose LP stays under max_vars, else None (fewer than min_intervals would fit)."""
    while True:
        bnd = grid(a, t0, t1, first, n)
        if n_conf * len(bnd) <= max_vars or n <= 8:
            break
        n //= 2
    if n_conf * len(bnd) > max_vars:  # many arrivals: keep as many as fit
        fit = max_vars // max(n_conf, 1) - (n + 1)
        if fit + n + 1 < min_intervals:
            return None
        bnd = grid(a, t0, t1, first, n, max_arrivals=max(fit, 0))
    return None if n_conf * len(bnd) > max_vars else bnd
