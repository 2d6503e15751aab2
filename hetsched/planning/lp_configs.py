"""Each job's configurations for the joint LP bound (:mod:`.lp_bound`): the Pareto ones,
and fewer, optimistic ones when the LP must stay small."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetsched.core.problem import PlanningProblem

__all__ = ["pareto_configs", "merge_configs", "job_classes", "class_of"]

#: merged configurations charge the fewest GPU-seconds of their members (else the fewest
#: GPUs at the fastest time: looser; kept to measure against)
AREA_MERGE = True


def pareto_configs(p: PlanningProblem, i: int, X: np.ndarray, iters: float | None = None,
                   it: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Configurations of job i that no smaller-or-equal one matches in speed; (X, p_i(x)),
    the time of ``iters`` iterations (default: the job's own) at iteration times ``it``
    (default: the model's, ``p.iter_time``)."""
    it = p.iter_time(i, X) if it is None else it
    ok = np.isfinite(it)
    X, it = X[ok], it[ok]
    order = np.lexsort((X.sum(axis=1), it))  # fastest first, fewer GPUs first among ties
    X, it = X[order], it[order]
    # dominated if an earlier (faster or as fast) configuration uses no more of every type;
    # ``up`` marks every count vector at or above a kept one (its up-set)
    up = np.zeros(tuple(int(v) + 1 for v in X.max(axis=0, initial=0)), dtype=bool)
    keep = np.zeros(len(X), dtype=bool)
    for r, x in enumerate(X.tolist()):
        if up[tuple(x)]:
            continue
        keep[r] = True
        up[tuple(slice(v, None) for v in x)] = True
    return X[keep], it[keep] * float(p.iters[i] if iters is None else iters)


def merge_configs(X: np.ndarray, pt: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``cap`` configurations: runs of neighbours merged into one that runs at
    the run's fastest time and charges, per GPU type, the fewest GPU-seconds any member
    of the run needs (``min_r p_r x_rt``, as counts over that time: fractional).

    Runs are taken within configurations that use the same set of GPU types
    (fastest first), each set getting runs in proportion to its size, so a
    merged configuration keeps its members' kind of GPUs (merging a V100-only
    with a K80-only configuration would give one that uses neither). A
    relaxation, so the bound stays valid: every schedule maps onto the merged
    configurations with no more GPU-seconds of any type and no more time per piece
    (the LP uses a configuration only through ``p`` and ``p x_t``), so capacity and
    running-time rows only loosen, and the tail ``Q`` (whose kernel is
    ``min(p_r, p_l)``) of the merged split is at most the original's. Charging
    ``p_min x min_r x_rt`` instead (``AREA_MERGE = False``: the fewest GPUs at the
    fastest time) is valid too, and never tighter.
    """
    if len(X) <= cap:
        return X, pt
    support = (X > 0) @ (1 << np.arange(X.shape[1]))
    kinds, counts = np.unique(support, return_counts=True)
    if len(kinds) > cap:  # too few runs to keep the sets apart: fastest-first runs
        kinds, counts, support = kinds[:1], np.array([len(X)]), np.full(len(X), kinds[0])
    share = np.maximum(1, np.floor(cap * counts / len(X))).astype(int)
    for j in np.argsort(-counts, kind="stable"):  # hand out what flooring left
        if share.sum() >= cap:
            break
        share[j] += min(cap - share.sum(), counts[j] - share[j])
    groups = []
    for kind, n in zip(kinds, share, strict=True):
        idx = np.nonzero(support == kind)[0]
        groups += np.array_split(idx[np.argsort(pt[idx], kind="stable")], min(n, len(idx)))
    pm = np.array([float(pt[g].min()) for g in groups])
    if AREA_MERGE:
        # GPU-seconds per type: the least any member needs, spread over the fastest time
        Xm = np.array([(pt[g, None] * X[g]).min(axis=0) / max(q, 1e-300)
                       for g, q in zip(groups, pm, strict=True)])
    else:
        Xm = np.array([X[g].min(axis=0) for g in groups])
    return Xm, pm


def job_classes(p: PlanningProblem, confs: list[tuple[np.ndarray, np.ndarray]]
                ) -> list[list[int]]:
    """The jobs grouped where the LP cannot tell them apart: same arrival, weight and
    configurations with the same times (first-seen order).

    One set of columns per class, its capacity use counted ``len(class)`` times and
    its weight summed, has the same optimum as a set per job with the class's window
    (the widest of its members'; any window is valid): the LP is convex and
    symmetric in a class's jobs, so averaging any solution over them is a solution
    of the same value that gives each the same schedule; and every schedule maps
    onto the class LP through that average (each job's own rows and cuts are
    linear or convex, so the average keeps them). A sweep of 30 copies of one job
    is one column set, not 30 that the simplex pivots among (degenerate: a 30-job
    sweep on 16 GPUs ran 100,000 iterations, 25 s, and gave no bound).
    """
    seen: dict[tuple[Any, ...], list[int]] = {}
    for i, (X, pt) in enumerate(confs):
        key = (float(p.arrival[i]), float(p.weight[i]), X.shape, X.tobytes(), pt.tobytes())
        seen.setdefault(key, []).append(i)
    return list(seen.values())


def class_of(cls: list[list[int]], n: int) -> np.ndarray:
    """Each job's class index."""
    out = np.zeros(n, dtype=int)
    for k, members in enumerate(cls):
        out[members] = k
    return out
