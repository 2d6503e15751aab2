"""A valid lower bound on total weighted JCT for space sharing.

Two relaxations; the bound is the larger of the two.

1. *Alone on the cluster.* Job i cannot finish sooner than if it had every
   GPU it may use (up to ``max_gpus``) from its arrival, with no communication
   and with the ``>= 1 sample per worker`` rule dropped. Its best iteration
   time is then the water-filling time over all those GPUs.

2. *One fluid machine.* Let ``r_i(g)`` be the peak samples/s of job i on GPU g
   (at its memory cap: ``b/(a+cb)`` grows with b, so no share does better) and
   ``R_i = sum_g r_i(g)``. Measure a job's progress as ``x_i = rate_i / R_i``;
   it needs ``p_i = samples_i / R_i`` units. Whatever the schedule, at any
   moment ``sum_i x_i <= kappa = sum_g max_i r_i(g)/R_i`` (each GPU serves one
   job). So the cluster is at most one machine of speed kappa, and Smith's
   rule (WSPT) on ``p_i / kappa`` gives a lower bound on ``sum w_i C_i`` of
   any preemptive schedule without release dates; subtracting
   ``sum w_i a_i`` turns it into a bound on weighted JCT.
"""

from __future__ import annotations

import numpy as np

from hetsched.problem import PlanningProblem


def best_iteration_time(p: PlanningProblem, i: int) -> float:
    """Fastest conceivable step of job i: all its allowed GPUs, b in [0, cap], no comm."""
    # per-GPU arrays of the allowed types
    types = np.nonzero(p.allowed[i])[0]
    a = np.repeat(p.a[i, types], p.n_type[types])
    c = np.repeat(p.c[i, types], p.n_type[types])
    cap = np.repeat(p.cap[i, types], p.n_type[types]).astype(float)
    m = int(min(p.hi[i], len(a)))
    B = float(p.B[i])

    def samples(T: float) -> float:
        per = np.clip((T - a) / c, 0.0, cap)
        return float(np.sort(per)[::-1][:m].sum())  # best m GPUs at this T

    lo, hi = 0.0, float((a + c * B).min())  # one GPU could do it all in this time, if memory allowed
    while samples(hi) < B:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if samples(mid) >= B:
            hi = mid
        else:
            lo = mid
    return lo


def lower_bound(p: PlanningProblem) -> float:
    S = p.S
    w = p.weight
    alone = np.array([p.iters[i] * best_iteration_time(p, i) for i in range(S)])
    lb_alone = float((w * alone).sum())

    r = np.array([p.per_gpu_rate(i) for i in range(S)])  # (S, T) per-GPU peak rate
    R = (r * p.n_type[None, :]).sum(axis=1)
    samples = p.iters * p.B
    proc = samples / R
    kappa = float(((r / R[:, None]).max(axis=0) * p.n_type).sum())
    ptime = proc / kappa
    order = np.argsort(-(w / ptime), kind="stable")
    completion = np.cumsum(ptime[order])
    lb_fluid = float((w[order] * completion).sum() - (w * p.arrival).sum())
    return max(lb_alone, lb_fluid)
