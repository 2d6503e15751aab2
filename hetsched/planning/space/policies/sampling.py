"""Sampling feasible-solution categories when there are too many to enumerate.

JPS (Algorithm 3) draws ``samples`` categories uniformly without
replacement from the rear fraction ``[alpha |Psi|, |Psi|)`` of Algorithm 1's
list, and HAS falls back to the same sampling at an event whose category
count exceeds its enumeration limit. ``|Psi| = C(K-1, S-1)`` overflows a C
long for a few hundred jobs on a few hundred GPUs (it has 300 digits for 500
jobs on 1,000 GPUs), so ranks are drawn as Python integers and unranked
directly: nothing is ever enumerated or converted to a machine integer.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from fractions import Fraction
from math import comb

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Snapshot


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """All compositions of ``total`` into ``parts`` positive parts, in Algorithm 1's order.

    The order varies K_2 fastest, then K_3, ..., with K_1 taking the rest:
    for K=5, S=3 it yields (3,1,1), (2,2,1), (1,3,1), (2,1,2), (1,2,2), (1,1,3).
    """
    if parts == 1:
        yield (total,)
        return
    for last in range(1, total - parts + 2):
        for head in compositions(total - last, parts - 1):
            yield (*head, last)


def count_compositions(total: int, parts: int) -> int:
    return comb(total - 1, parts - 1) if total >= parts >= 1 else 0


def unrank_composition(rank: int, total: int, parts: int) -> tuple[int, ...]:
    """The composition at position ``rank`` of :func:`compositions` without enumerating."""
    out = [0] * parts
    n = total
    for i in range(parts - 1, 0, -1):
        v = 1
        while True:
            cnt = comb(n - v - 1, i - 1)
            if rank < cnt:
                break
            rank -= cnt
            v += 1
        out[i] = v
        n -= v
    out[0] = n
    return tuple(out)


def count_bounded(total: int, lo: list[int], hi: list[int], limit: int | None = None) -> int:
    """How many compositions of ``total`` have ``lo[j] <= K_j <= hi[j]`` (and K_j >= 1).

    With ``limit``, counts saturate at ``limit + 1``: the answer is exact up to
    ``limit`` and ``limit + 1`` for anything above (HAS only asks whether an
    event's categories exceed ``exact_max``). The saturating count is one
    prefix-sum difference per job over numpy integers, O(jobs x total); the
    exact one works on Python integers (counts with hundreds of digits).
    """
    if limit is not None:
        cap = int(limit) + 1
        ways = np.zeros(total + 1, dtype=np.int64)
        ways[0] = 1
        for a, b in zip(lo, hi, strict=True):
            a, b = max(a, 1), min(b, total)
            if a > b:
                return 0
            pre = np.concatenate(([0], np.cumsum(ways)))  # pre[s] = sum ways[:s]
            s = np.arange(total + 1)
            # new[s] = sum_{k=a..b} ways[s-k] = pre[s-a+1] - pre[max(s-b, 0)]
            top = np.clip(s - a + 1, 0, total + 1)
            low = np.clip(s - b, 0, total + 1)
            ways = np.minimum(np.where(s >= a, pre[top] - pre[low], 0), cap)
        return int(ways[total])
    exact = {0: 1}
    for a, b in zip(lo, hi, strict=True):
        a = max(a, 1)
        nxt: dict[int, int] = {}
        for s_, w in exact.items():
            for k in range(a, min(b, total - s_) + 1):
                nxt[s_ + k] = nxt.get(s_ + k, 0) + w
        exact = nxt
    return exact.get(total, 0)


def bounded_compositions(total: int, lo: list[int], hi: list[int]
                         ) -> Iterator[tuple[int, ...]]:
    """The compositions of :func:`compositions` within the bounds, in the same order.

    Infeasible branches are pruned as they are entered (the part's range is
    cut to what the other parts can still complete), so the cost is the
    number of feasible categories, not of all compositions.
    """
    parts = len(lo)
    lo = [max(v, 1) for v in lo]
    lo_pre = [sum(lo[:j]) for j in range(parts + 1)]
    hi_pre = [sum(hi[:j]) for j in range(parts + 1)]

    def rec(t: int, j: int) -> Iterator[tuple[int, ...]]:
        # parts 0..j-1 sum to t
        if j == 1:
            if lo[0] <= t <= hi[0]:
                yield (t,)
            return
        first = max(lo[j - 1], t - hi_pre[j - 1])
        last = min(hi[j - 1], t - lo_pre[j - 1])
        for k in range(first, last + 1):
            for head in rec(t - k, j - 1):
                yield (*head, k)

    if parts and lo_pre[parts] <= total <= hi_pre[parts]:
        yield from rec(total, parts)


def latency_order(p: PlanningProblem, snap: Snapshot, rows: list[int]) -> list[int]:
    """JPS's job prioritising (Algorithm 3, line 1): ascending computation latency with
    every free GPU, so the rear of the category list gives heavier jobs more GPUs."""
    lat = []
    for r in rows:
        i = int(snap.jobs[r])
        allrate = float((p.per_gpu_rate(i) * snap.free).sum())
        lat.append(snap.remaining[r] * p.B[i] / allrate if allrate > 0 else np.inf)
    return [rows[k] for k in np.argsort(lat, kind="stable")]


#: below this many candidate ranks numpy's sampler is used (plans stay as they were)
NUMPY_SPAN_MAX = 2**62


def rear_start(n: int, alpha: float) -> int:
    """First rank of the rear fraction ``[alpha n, n)``, exact for any ``n``."""
    if n < 2**53:
        return int(alpha * n)
    return int(Fraction(alpha) * n)


def rear_ranks(n: int, alpha: float, samples: int, seed: int) -> list[int]:
    """``samples`` distinct ranks drawn uniformly from ``[alpha n, n)``, ascending."""
    start = rear_start(n, alpha)
    span = n - start
    if span <= samples:
        return list(range(start, n))
    if span < NUMPY_SPAN_MAX:  # offsets from numpy, added to start as Python ints: start
        rng = np.random.default_rng(seed)  # itself may be far beyond int64
        return sorted(start + int(x) for x in rng.choice(span, samples, replace=False))
    # a span beyond any machine integer: Python's arbitrary-precision randrange;
    # with span > 2^62 >> samples a repeat is practically impossible, but is redrawn
    gen = random.Random(seed)
    got: set[int] = set()
    while len(got) < samples:
        got.add(start + gen.randrange(span))
    return sorted(got)


def sample_categories(total: int, parts: int, alpha: float, samples: int,
                      seed: int) -> list[tuple[int, ...]]:
    """Sampled compositions of ``total`` GPUs into ``parts`` jobs (Algorithm 1's order)."""
    n = count_compositions(total, parts)
    return [unrank_composition(r, total, parts) for r in rear_ranks(n, alpha, samples, seed)]


__all__ = ["bounded_compositions", "count_bounded", "latency_order", "compositions", "count_compositions", "unrank_composition", "rear_start", "rear_ranks", "sample_categories"]
