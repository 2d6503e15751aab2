"""The pooled-speed bound: the cluster as one machine, release dates and all.

Give each GPU type a price ``pi_t >= 0``; the cluster holds ``Cap = pi.n``
worth of GPUs. Job i on configuration ``x`` (GPU counts per type) runs its
whole work in ``p_i(x)`` seconds (the LP's optimistic model, lp_bound.py), so
finishing a fraction ``f`` of it costs ``f * p_i(x) * pi.x`` priced
GPU-seconds, at least ``f * e_i`` with ``e_i = min_x p_i(x) pi.x``. Map any
schedule to one machine of speed ``Cap`` that processes job i at rate
``e_i f_i(t)`` (``f_i`` = the fraction of job i done per second): it never
exceeds ``Cap``, job i gets ``e_i`` in all, never before its arrival, and its
mean busy time there is the job's own ``M_i = int t f_i(t) dt``.

* Goemans (1997): over every preemptive one-machine schedule with release
  dates, ``sum w_i M_i`` is least for preemptive WSPT (at each moment the
  released job of largest ``w_i / q_i``, ``q_i = e_i / Cap``), so that
  schedule's mean busy times bound ``sum w_i M_i`` of every real schedule.
* Job i runs on one configuration at a time, ``f_i <= 1 / P_i`` with
  ``P_i = min_x p_i(x)``, and all its work is done by ``C_i``, so
  ``C_i >= M_i + P_i / 2``.

Hence ``sum w_i (C_i - a_i) >= sum w_i (M_i^WSPT + P_i / 2 - a_i)`` for every
price vector. This is the parallel-machine (Eastman-Even-Isaacs / Queyranne)
bound with heterogeneous GPUs priced into one pool and release dates kept; it
costs a sort per price, and with many jobs it is far stronger than a bound
that looks at one job at a time. :func:`pooled_bound` tries a fixed family of
prices (deterministic) and keeps the best, with its WSPT completion estimates
(the LP's grid places boundaries among them). The joint LP also takes the
inequalities behind this bound as cuts (``lp_pooled_cuts.py``), so where it runs
it is at least this bound.
"""

from __future__ import annotations

import heapq

import numpy as np

#: exponents ``alpha`` of the price family ``pi_t = speed_t ** alpha`` (0: one per GPU)
ALPHAS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)


def wspt_mean_busy(w: np.ndarray, q: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Mean busy times of preemptive WSPT on one unit-speed machine with release dates.

    ``q`` processing times (0 allowed: done at release), ``r`` release dates;
    ties broken by index, so the result is deterministic.
    """
    n = len(q)
    M = np.array(r, dtype=float)
    acc = np.zeros(n)  # integral of t over job i's busy pieces
    left = np.array(q, dtype=float)
    order = np.lexsort((np.arange(n), r))
    heap: list[tuple[float, int]] = []
    t = 0.0
    k = 0
    while k < n or heap:
        if not heap:
            t = max(t, float(r[order[k]]))
        while k < n and r[order[k]] <= t:
            i = int(order[k])
            k += 1
            if q[i] > 0:
                heapq.heappush(heap, (-float(w[i]) / float(q[i]), i))
        if not heap:
            continue
        _, i = heap[0]
        end = t + left[i]
        nxt = float(r[order[k]]) if k < n else np.inf
        stop = min(end, nxt)
        acc[i] += 0.5 * (stop * stop - t * t)
        left[i] -= stop - t
        t = stop
        if stop >= end:
            heapq.heappop(heap)
            M[i] = acc[i] / float(q[i])
    return M


def price_family(speed: np.ndarray) -> list[np.ndarray]:
    """The fixed price vectors tried: per-type relative speeds to the powers ``ALPHAS``."""
    s = np.where(speed > 0, speed / max(float(speed.max()), 1e-300), 0.0)
    out = []
    for al in ALPHAS:
        pi = np.where(s > 0, s ** al, 0.0) if al > 0 else np.ones_like(s)
        if pi.max() > 0:
            out.append(pi)
    return out


def pooled_bound(w: np.ndarray, arrival: np.ndarray, P: np.ndarray, e: np.ndarray,
                 n_type: np.ndarray, prices: list[np.ndarray]
                 ) -> tuple[float, np.ndarray]:
    """The best pooled-speed bound over ``prices`` on total weighted JCT (module docstring).

    ``P[i]`` job i's least time on any configuration, ``e[k, i]`` its least
    priced GPU-seconds under ``prices[k]``. Returns the bound and, for the
    price that gave it, each job's estimated completion ``M_i + P_i / 2``.
    """
    best, comp = 0.0, arrival + P
    for k, pi in enumerate(prices):
        cap = float(pi @ n_type)
        if cap <= 0:
            continue
        M = wspt_mean_busy(w, e[k] / cap, arrival)
        val = float((w * (M + 0.5 * P - arrival)).sum())
        if val > best:
            best, comp = val, M + 0.5 * P
    return best, comp
