"""The pooled machine's inequalities as cuts of the joint LP (:mod:`.lp_bound`).

The pooled-speed bound (:mod:`.pooled_bound`) maps any schedule onto one machine
of priced capacity ``Cap = pi.n``: job i occupies it for ``q_i = e_i / Cap``
seconds in all, never before its arrival, with mean busy time ``M_i``. On one
machine the jobs of a set S cannot do better than their work packed as early as
their arrivals allow (Goemans 1997):

    ``sum_{i in S} q_i M_i >= f(S)``,  ``f(S) = int t dt`` over the busy time of S's
    work run as soon as it arrives (the order within S does not matter),

and preemptive WSPT's mean busy times are the least ``sum w_i M_i`` over all these
inequalities (``f`` is supermodular; the greedy order is ``w_i / q_i``, and the
sets of its prefixes carry the optimal dual). A job runs one configuration at a
time, never faster than its least time ``P_i``, so ``M_i <= C_i - P_i / 2`` and

    ``sum_{i in S} q_i (C_i - P_i / 2) >= f(S)``

holds for the completion times of every schedule, on the LP's own ``C`` columns.

* **Before the first solve**, the chain of the price whose pooled bound is
  largest: the prefixes in ``w_i / q_i`` order. By LP duality the LP with it is
  at least that bound (``sum w_i (M_i^WSPT + P_i / 2 - a_i)``), so never below
  the pooled bound, and it adds what the pooled machine does not see: which GPU
  types the jobs contend for, and how fast each job can run at all. (Every
  price's chain gave the same values to 0.1% for 1.7-4.3x the CPU at 200 jobs.)
* **Each round**, for each price, the prefixes in the order of ``C_i - P_i / 2`` at
  the LP's solution; the ``MAX_PER_PRICE`` most violated are added.

Jobs the LP cannot tell apart share one ``C`` column (:func:`lp_configs.job_classes`);
a set holding k of a class's members has coefficient ``k q`` on its column (each
permutation of identical jobs is a schedule too, so the average, which the class
column stands for, obeys every inequality).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

#: cuts added per price and round at most (the most violated)
MAX_PER_PRICE = 16
#: relative violation below which a set's inequality counts as met
TOLERANCE = 1e-6


@dataclass(frozen=True)
class PooledInputs:
    """What the pooled bound knows of each job: its least time ``P`` (S,) and its least
    priced GPU-seconds ``E`` (K, S) under each price vector of ``prices`` (K of (T,))."""

    P: np.ndarray
    E: np.ndarray
    prices: list[np.ndarray]


def asap_prefixes(q: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``f`` of each prefix of the jobs as given: ``out[k]`` is ``int t dt`` over the busy
    time of jobs ``0..k`` (lengths ``q``, arrivals ``a``) run as soon as they arrive."""
    starts: list[float] = []
    ends: list[float] = []
    total = 0.0
    out = np.empty(len(q))
    for k in range(len(q)):
        total += _fill(starts, ends, float(a[k]), float(q[k]))
        out[k] = total
    return out


def _fill(starts: list[float], ends: list[float], t: float, left: float) -> float:
    """Run ``left`` seconds of work in the earliest idle time from ``t`` on, the busy time
    being the sorted, disjoint intervals ``[starts, ends)`` (updated); its ``int t dt``."""
    total = 0.0
    j = bisect.bisect_right(ends, t)  # the first interval that ends after t
    while left > 0:
        if j < len(starts) and starts[j] <= t:  # busy at t: skip to the interval's end
            t = ends[j]
            j += 1
            continue
        run = min(left, (starts[j] if j < len(starts) else math.inf) - t)
        total += 0.5 * ((t + run) ** 2 - t * t)
        left -= run
        if j > 0 and ends[j - 1] == t:  # continues the interval before
            ends[j - 1] = t + run
            j -= 1
        else:
            starts.insert(j, t)
            ends.insert(j, t + run)
        if j + 1 < len(starts) and ends[j] >= starts[j + 1]:  # reaches the next one
            ends[j] = ends.pop(j + 1)
            starts.pop(j + 1)
        t = ends[j]
        j += 1
    return total


@dataclass
class PooledCuts:
    """The inequalities on the LP's scaled time (``(t - t0) / scale``), per job class:
    ``q`` (K, C) each class's time on each price's machine, ``half`` (C,) half its least
    time, ``a`` (C,) its arrival, ``w`` (C,) one member's weight, ``mult`` (C,) its
    members."""

    q: np.ndarray
    half: np.ndarray
    a: np.ndarray
    w: np.ndarray
    mult: np.ndarray

    @classmethod
    def of(cls, inputs: PooledInputs, n_type: np.ndarray, reps: np.ndarray, mult: np.ndarray,
           arrival: np.ndarray, weight: np.ndarray, t0: float, scale: float) -> PooledCuts:
        """The classes' inputs (``reps``: each class's first job; ``arrival`` and ``weight``
        per class) on the LP's time scale."""
        caps = np.array([float(pi @ n_type) for pi in inputs.prices])
        keep = caps > 0
        q = np.asarray(inputs.E, dtype=float)[keep][:, reps] / caps[keep][:, None] / scale
        return cls(q=np.where(np.isfinite(q), q, 0.0), half=inputs.P[reps] / scale / 2.0,
                   a=(arrival - t0) / scale, w=np.asarray(weight, dtype=float),
                   mult=np.asarray(mult, dtype=int))

    def _cut(self, q: np.ndarray, member: np.ndarray, prefix: np.ndarray, f: float
             ) -> tuple[list[tuple[int, float]], float]:
        """``sum coef * C[class] >= lower`` of the set ``prefix`` (member indices)."""
        coef = np.bincount(member[prefix], weights=q[prefix], minlength=len(self.a))
        cols = np.flatnonzero(coef)
        return ([(int(c), float(coef[c])) for c in cols],
                float(f + (coef[cols] * self.half[cols]).sum()))

    def _members(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.a)), self.mult)

    def _prefixes(self, q: np.ndarray, member: np.ndarray, key: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """The members with work on this price's machine in ascending ``key`` (ties by
        index) and ``f`` of each prefix of them."""
        idx = np.flatnonzero(q > 0)
        idx = idx[np.lexsort((idx, key[idx]))]
        return idx, asap_prefixes(q[idx], self.a[member[idx]])

    def chains(self) -> list[tuple[list[tuple[int, float]], float]]:
        """The chain of the price whose pooled bound is largest: the prefixes in ``w / q``
        order (module docstring). Its value is that bound, computed here from the chain
        (the greedy's mean busy times are ``f``'s increments over ``q``)."""
        member = self._members()
        w = self.w[member]
        best: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
        for q_all in self.q:
            q = q_all[member]
            idx, f = self._prefixes(q, member, -w / np.where(q > 0, q, 1.0))
            M = np.diff(f, prepend=0.0) / q[idx]
            value = float((w[idx] * (M + self.half[member[idx]])).sum())
            if best is None or value > best[0]:
                best = (value, q, idx, f)
        if best is None:
            return []
        _, q, idx, f = best
        return [self._cut(q, member, idx[:k + 1], float(f[k])) for k in range(len(idx))]

    def violated(self, C: np.ndarray) -> list[tuple[list[tuple[int, float]], float]]:
        """Cuts violated at the classes' completions ``C`` (scaled): each price's prefixes
        in the order of ``C - P / 2``, the ``MAX_PER_PRICE`` most violated."""
        member = self._members()
        v = (C - self.half)[member]
        out: list[tuple[list[tuple[int, float]], float]] = []
        for q_all in self.q:
            q = q_all[member]
            idx, f = self._prefixes(q, member, v)
            lhs = np.cumsum(q[idx] * v[idx])
            gap = (f - lhs) / np.maximum(np.abs(f), 1e-12)
            top = [k for k in np.argsort(-gap, kind="stable")[:MAX_PER_PRICE]
                   if gap[k] > TOLERANCE]
            out += [self._cut(q, member, idx[:k + 1], float(f[k])) for k in top]
        return out


__all__ = ["MAX_PER_PRICE", "PooledCuts", "PooledInputs", "asap_prefixes"]
