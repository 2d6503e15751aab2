"""The performance model: batch shares, communication and iteration time.

Step time of a worker is affine in its local batch, ``t(b) = a + c*b`` with
``1 <= b <= cap``, or a piecewise-linear ``Curve`` where the profile's line is
poor (``StepFit.curve``; the shares and the estimates take the same one). A data-parallel iteration takes as long as its slowest
worker plus the ring all-reduce of the gradients. These functions are the
only place where that model is written down; policies, the evaluator and the
runtime all call them.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

BITS_PER_MB = 8e6  # model sizes are in MB (10^6 bytes)
CHUNK = 65536  # rows per vectorised water-filling batch


class SharesError(ValueError):
    """The global batch cannot be split over these workers (too few or too many)."""


def _check(B: int, caps: Sequence[int]) -> None:
    K = len(caps)
    if K == 0:
        raise SharesError("no workers")
    if B < K:
        raise SharesError(f"global batch {B} is smaller than the {K} workers (each needs >= 1)")
    if B > sum(caps):
        raise SharesError(f"global batch {B} exceeds the workers' memory caps (sum {sum(caps)})")


#: a worker's step time where the affine line is poor: a strictly increasing
#: piecewise-linear curve (local batches, seconds) from batch 1 to the cap; None: ``a + c*b``
Curve = tuple[np.ndarray, np.ndarray] | None


def interp1(x: float, xp: Sequence[float], fp: Sequence[float]) -> float:
    """``np.interp`` at one point on plain lists (same formula; a scalar numpy call is ~10x
    slower, and the integer share repair evaluates step times one worker at a time)."""
    if x <= xp[0]:
        return float(fp[0])
    if x >= xp[-1]:
        return float(fp[-1])
    j = bisect.bisect_right(xp, x) - 1
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    return float(slope * (x - xp[j]) + fp[j])


def worker_time(a: float, c: float, curve: Curve, b: Any) -> Any:
    """Step time of one worker at local batch(es) ``b``: its curve, else ``a + c*b``."""
    if curve is None:
        return a + c * b
    return np.interp(b, curve[0], curve[1])


def continuous_time(a: np.ndarray, c: np.ndarray, cap: np.ndarray, B: float,
                    curves: Sequence[Curve] | None = None) -> float:
    """Smallest T such that workers with step time ``a+c*b`` can process B samples in T.

    Water-filling: worker k takes ``clip((T-a_k)/c_k, 1, cap_k)`` samples (the
    inverse of its curve where ``curves[k]`` is given); T is at least the
    slowest worker's time for one sample. Exact (breakpoint search on a
    piecewise-linear function), not iterative.
    """
    return float(continuous_time_counts(a, c, cap, np.ones((1, len(a))), B, curves)[0])


def continuous_time_counts(a: np.ndarray, c: np.ndarray, cap: np.ndarray, N: np.ndarray,
                           B: float | np.ndarray, curves: Sequence[Curve] | None = None
                           ) -> np.ndarray:
    """Vectorised water-filling over many allocations at once.

    ``a, c, cap`` have shape (T,) (one entry per GPU type), ``N`` has shape
    (M, T): N[m, t] workers of type t in allocation m. ``curves[t]`` (where
    not None) replaces type t's line by its piecewise curve; its knots join
    the breakpoints, so the result stays exact. Returns the optimal
    (continuous) step time per allocation, ``inf`` where B does not fit in the
    caps or N is empty.
    """
    N = np.asarray(N, dtype=float)
    M, T = N.shape
    if M > CHUNK:  # bound the (M, points, T) temporaries
        Bv0 = np.broadcast_to(np.asarray(B, dtype=float), (M,))
        return np.concatenate([continuous_time_counts(a, c, cap, N[k:k + CHUNK],
                                                      Bv0[k:k + CHUNK], curves)
                               for k in range(0, M, CHUNK)])
    a = np.asarray(a, dtype=float)
    c = np.asarray(c, dtype=float)
    cap = np.asarray(cap, dtype=float)
    Bv = np.broadcast_to(np.asarray(B, dtype=float), (M,))
    used = N > 0
    lo = a + c  # time for one sample
    hi = a + c * cap  # time at the cap
    bent = [(t, cv) for t, cv in enumerate(curves or ()) if cv is not None]
    for t, (_, ts) in bent:
        lo[t], hi[t] = ts[0], ts[-1]
    t0 = np.where(used, lo[None, :], -np.inf).max(axis=1)  # every used worker has >= 1 sample

    def g(tv: np.ndarray) -> np.ndarray:
        # tv: (M, P) candidate times -> (M, P) samples processed
        per = np.clip((tv[:, :, None] - a) / c, 1.0, cap)  # (M, P, T)
        for t, (bs, ts) in bent:
            per[:, :, t] = np.clip(np.interp(tv, ts, bs), 1.0, cap[t])
        return (per * N[:, None, :]).sum(axis=2)

    bp = np.unique(np.concatenate([lo, hi, *[ts for _, (_, ts) in bent]]))
    pts = np.concatenate([t0[:, None], np.broadcast_to(bp, (M, len(bp)))], axis=1)
    pts = np.maximum(pts, t0[:, None])  # breakpoints below t0 collapse onto t0
    pts.sort(axis=1)
    G = g(pts)
    ok = G >= Bv[:, None] - 1e-9
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), -1)
    out = np.full(M, np.inf)
    rows = np.nonzero(first >= 0)[0]
    k = first[rows]
    at0 = k == 0
    out[rows[at0]] = pts[rows[at0], 0]
    r = rows[~at0]
    k = k[~at0]
    t_hi, t_lo = pts[r, k], pts[r, k - 1]
    g_hi, g_lo = G[r, k], G[r, k - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(g_hi > g_lo, (Bv[r] - g_lo) / (g_hi - g_lo), 1.0)
    out[r] = t_lo + frac * (t_hi - t_lo)
    out[~used.any(axis=1)] = np.inf
    return out


def balanced_shares(a: Sequence[float], c: Sequence[float], caps: Sequence[int], B: int,
                    curves: Sequence[Curve] | None = None) -> list[int]:
    """Integer local batches summing to B that minimise the slowest worker's step time.

    Water-filling on the model (the affine line, or a worker's piecewise
    curve where ``curves[k]`` is given: the same model the planner predicts
    with) gives the continuous optimum; flooring it and then adding one
    sample at a time to the worker whose step time after the addition is
    smallest is exact for a min-max of increasing functions (there is an
    optimal integer solution above the floor).
    """
    _check(B, caps)
    av, cv, capv = (np.asarray(x, dtype=float) for x in (a, c, caps))
    cvs: list[Curve] = list(curves) if curves is not None else [None] * len(caps)
    # per worker: plain-list knots (batches, times) of its curve, None for the line
    lists: dict[int, tuple[list[float], list[float]]] = {}
    pw = [None if cu is None else lists.setdefault(id(cu), (cu[0].tolist(), cu[1].tolist()))
          for cu in cvs]
    al, cl = av.tolist(), cv.tolist()

    def f(k: int, b: float) -> float:
        kn = pw[k]
        return al[k] + cl[k] * b if kn is None else interp1(b, kn[0], kn[1])

    T = continuous_time(av, cv, capv, B, cvs)
    x = np.clip((T - av) / cv, 1.0, capv)
    for k, curve in enumerate(cvs):
        if curve is not None:
            x[k] = min(max(float(np.interp(T, curve[1], curve[0])), 1.0), capv[k])
    b = np.maximum(1, np.floor(x + 1e-9)).astype(int)
    b = np.minimum(b, np.asarray(caps, dtype=int))
    left = B - int(b.sum())
    if left < 0:  # floating error pushed us over: take back from the slowest
        heap = [(-f(k, b[k]), k) for k in range(len(b)) if b[k] > 1]
        heapq.heapify(heap)
        while left < 0:
            _, k = heapq.heappop(heap)
            b[k] -= 1
            left += 1
            if b[k] > 1:
                heapq.heappush(heap, (-f(k, b[k]), k))
    heap = [(f(k, b[k] + 1), k) for k in range(len(b)) if b[k] < caps[k]]
    heapq.heapify(heap)
    while left > 0:
        _, k = heapq.heappop(heap)
        b[k] += 1
        left -= 1
        if b[k] < caps[k]:
            heapq.heappush(heap, (f(k, b[k] + 1), k))
    return [int(v) for v in b]


def _round_to_sum(x: np.ndarray, caps: Sequence[int], B: int) -> list[int]:
    """Largest-remainder rounding of a real split, within [1, cap]."""
    capv = np.asarray(caps, dtype=int)
    b = np.clip(np.floor(x).astype(int), 1, capv)
    left = B - int(b.sum())
    order = np.argsort(-(x - np.floor(x)), kind="stable")
    i = 0
    while left != 0:
        k = order[i % len(order)]
        if left > 0 and b[k] < capv[k]:
            b[k] += 1
            left -= 1
        elif left < 0 and b[k] > 1:
            b[k] -= 1
            left += 1
        i += 1
    return [int(v) for v in b]


def proportional_shares(a: Sequence[float], c: Sequence[float], caps: Sequence[int],
                        B: int) -> list[int]:
    """The HAS paper's eq. (12): shares proportional to each worker's throughput.

    The throughput is the one a profile at the equal-split batch would report,
    ``rho_k = b/(a_k + c_k*b)`` with ``b = B/K``. With ``a = 0`` this equals
    :func:`balanced_shares` up to rounding; with intercepts it is worse.
    """
    _check(B, caps)
    av, cv = np.asarray(a, dtype=float), np.asarray(c, dtype=float)
    beq = min(B / len(caps), float(min(caps)))
    rho = beq / (av + cv * beq)
    x = B * rho / rho.sum()
    capv = np.asarray(caps, dtype=float)
    # respect caps by capping and redistributing the excess proportionally
    for _ in range(len(caps)):
        over = x > capv
        if not over.any():
            break
        excess = float((x[over] - capv[over]).sum())
        x[over] = capv[over]
        free = ~over & (x < capv)
        x[free] += excess * rho[free] / rho[free].sum()
    return _round_to_sum(x, caps, B)


def equal_shares(caps: Sequence[int], B: int) -> list[int]:
    """Equal split (what data-parallel frameworks do by default), within each cap."""
    _check(B, caps)
    K = len(caps)
    capv = np.asarray(caps, dtype=int)
    b = np.full(K, B // K)
    b[: B % K] += 1
    # a worker over its cap hands the excess to the others, evenly
    while (b > capv).any():
        excess = int((b - capv)[b > capv].sum())
        b = np.minimum(b, capv)
        room = np.nonzero(b < capv)[0]
        for i in range(excess):
            b[room[i % len(room)]] += 1
    return [int(v) for v in b]


def step_time(a: Sequence[float], c: Sequence[float], batches: Sequence[int],
              curves: Sequence[Curve] | None = None) -> float:
    """Slowest worker's step time for given local batches (piecewise where ``curves[k]``)."""
    if curves is None:
        return max(ak + ck * bk for ak, ck, bk in zip(a, c, batches, strict=True))
    return max(float(worker_time(ak, ck, cv, bk))
               for ak, ck, cv, bk in zip(a, c, curves, batches, strict=True))


def ring_allreduce_s(workers: Any, model_size_mb: Any, bandwidth_gbps: Any) -> Any:
    """The ring all-reduce formula, once: 2(K-1)/K of the gradient over the bottleneck link.

    Element-wise: scalars or numpy arrays (the policies' vectorised estimates).
    Callers handle K <= 1 (no communication).
    """
    return 2.0 * (workers - 1) / workers * model_size_mb * BITS_PER_MB / (bandwidth_gbps * 1e9)


def allreduce_time(workers: int, model_size_mb: float, bandwidth_gbps: float) -> float:
    """Ring all-reduce time of one iteration (0 for one worker or an unknown model size)."""
    if workers <= 1 or model_size_mb <= 0:
        return 0.0
    return float(ring_allreduce_s(workers, model_size_mb, bandwidth_gbps))


def comm_time(workers: int, model_size_mb: float, bandwidth_gbps: float,
              measured_sync_s: float) -> float:
    """Synchronisation time per iteration.

    The ring all-reduce model when the job gives its model size; otherwise the
    synchronisation time measured by the profiler (0 for one worker).
    """
    if workers <= 1:
        return 0.0
    if model_size_mb > 0:
        return allreduce_time(workers, model_size_mb, bandwidth_gbps)
    return measured_sync_s
