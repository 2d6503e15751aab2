"""Exhaustive: the exact optimum of the placement problem at each reset event.

The HAS paper's exhaustive search enumerates every worker subset per job
(2.2 hours for 4 jobs on 30 GPUs). Under the model, GPUs of one type are
interchangeable, and the predicted weighted JCT is a sum over jobs of a
function of that job's per-type counts. So the exact optimum over all
placements is a dynamic programme over jobs with the vector of GPUs left per
type as the state: ``V_j(s) = min_{x <= s} f_j(x) + V_{j-1}(s - x)``. It
visits every (state, allocation) pair, which is the exhaustive search with
interchangeable GPUs merged, and it refuses above ``max_pairs``.

Like P1, every admitted job gets at least one GPU (min_gpus); GPUs may stay
idle when that predicts lower JCT.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.errors import PlanningError
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import admit, smith_priority


@register
class Exhaustive(Policy):
    name = "exhaustive"
    paper = "HAS paper (Zhou et al., TPDS 2024), Sec. VI: exhaustive search"
    summary = "Exact optimum of each event's placement problem (DP over per-type GPU counts)"
    param_docs = {"max_pairs": "refuse above this many (state, allocation) pairs"}

    def __init__(self, *, max_pairs: int = 20_000_000) -> None:
        self.max_pairs = int(max_pairs)
        self._grids: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}

    #: seconds per (state, allocation) pair and job in the DP (numpy, measured on the 2-core VM:
    #: 5e-9 on Gavel's traces with the grids kept, bench_work_calibration.py)
    SECONDS_PER_PAIR = 6e-9
    #: pairs of the grids kept between events (about 32 bytes each)
    GRID_CACHE_PAIRS = 4_000_000

    @classmethod
    def cost(cls, problem: PlanningProblem) -> float | None:
        """Predicted planning seconds: a DP over every pair at each of ~2 events per job.

        Infinite when the whole cluster's pairs exceed the default ``max_pairs``
        (it would refuse at the first event).
        """
        n = problem.n_type.astype(float)
        pairs = float(np.prod((n + 1) * (n + 2) / 2))
        if pairs > 20_000_000:
            return float("inf")
        jobs = min(problem.S, problem.K)
        return 2 * problem.S * jobs * pairs * cls.SECONDS_PER_PAIR

    @classmethod
    def predict_work(cls, problem: PlanningProblem, active: list[int],
                     horizon_s: float = 0.0) -> float:
        """Every event's DP over the whole cluster's pairs, one pass per active job."""
        c = cls.cost(problem)
        if c is None or not np.isfinite(c):
            return float("inf")
        n = problem.n_type.astype(float)
        pairs = float(np.prod((n + 1) * (n + 2) / 2))
        k = np.minimum(np.asarray(active, dtype=float), problem.K)
        return float(len(k) * cls.EVENT_S + k.sum() * (cls.JOB_S + pairs * cls.SECONDS_PER_PAIR))

    def _grid(self, n: np.ndarray) -> tuple[np.ndarray, ...]:
        """:func:`_grid` of the free GPUs ``n``, kept for later events: the free counts
        take few distinct values over a plan (11-25 on Gavel's traces, the whole cluster
        at half the events), and building the pairs had been a third of the search's
        time. The most recently used grids are kept, up to ``GRID_CACHE_PAIRS`` pairs."""
        key = tuple(int(v) for v in n)
        hit = self._grids.pop(key, None)
        grid = hit if hit is not None else _grid(n)
        self._grids[key] = grid  # most recent last
        while len(self._grids) > 1 and sum(len(g[1]) for g in self._grids.values()) \
                > self.GRID_CACHE_PAIRS:
            del self._grids[next(iter(self._grids))]
        return grid

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.zeros((len(snap.jobs), p.T), dtype=int)
        rows, _ = admit(p, snap, smith_priority(p, snap))
        if not rows:
            return X
        n = snap.free
        dims = n + 1
        P = int(np.prod(dims))
        pairs = int(np.prod((n + 1) * (n + 2) // 2))
        if pairs > self.max_pairs:
            raise PlanningError(
                f"exhaustive: {pairs:,} (state, allocation) pairs for {len(rows)} jobs on "
                f"{int(n.sum())} GPUs of {p.T} types exceeds max_pairs={self.max_pairs:,}; "
                "use has or jps, or raise --param max_pairs=N")
        states, s_idx, x_idx, d_idx, starts = self._grid(n)
        self.work_s += len(rows) * len(s_idx) * self.SECONDS_PER_PAIR
        V = np.zeros(P)
        choice = []
        for r in rows:
            i = int(snap.jobs[r])
            f = p.weight[i] * snap.remaining[r] * p.iter_time(i, states)
            k = states.sum(axis=1)
            f[(k < p.lo[i]) | (k > p.hi[i]) | (k == 0)] = np.inf
            tot = f[x_idx] + V[d_idx]
            # pairs are grouped by state, in state order (every state has x = 0)
            newV = np.minimum.reduceat(tot, starts)
            # argmin per state: first pair achieving the minimum
            hit = tot == newV[s_idx]
            arg = np.full(P, -1)
            sel = np.nonzero(hit)[0][::-1]
            arg[s_idx[sel]] = x_idx[sel]
            choice.append(arg)
            V = newV
        s = P - 1  # all free GPUs available
        if not np.isfinite(V[s]):
            return X
        for r, arg in zip(reversed(rows), reversed(choice), strict=True):
            x = int(arg[s])
            X[r] = states[x]
            s = int(np.ravel_multi_index(tuple(states[s] - states[x]), dims))
        return X


def _grid(n: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every state ``s <= n`` (per-type counts) and every pair ``x <= s``: the states, per
    pair the flat indices of ``s``, ``x`` and ``s - x`` (grouped by ``s``, in order), and
    where each state's pairs start."""
    dims = n + 1
    P = int(np.prod(dims))
    states = np.array(np.unravel_index(np.arange(P), dims)).T  # (P, T)
    # all (s, x) with x <= s, as flat indices
    le = (states[None, :, :] <= states[:, None, :]).all(axis=2) if P <= 4096 else None
    if le is not None:
        s_idx, x_idx = np.nonzero(le)
    else:
        s_idx, x_idx = _pairs(states, dims)
    d_idx = np.ravel_multi_index((states[s_idx] - states[x_idx]).T, dims)
    # where each state's pairs start (s_idx is sorted: both enumerations go state by state)
    starts = np.searchsorted(s_idx, np.arange(P))
    return states, s_idx, x_idx, d_idx, starts


def _pairs(states: np.ndarray, dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(state, sub-state) index pairs without a P x P matrix."""
    s_all, x_all = [], []
    for s, st in enumerate(states):
        sub = np.array(np.meshgrid(*[np.arange(v + 1) for v in st], indexing="ij")).reshape(
            len(st), -1).T
        x_all.append(np.ravel_multi_index(sub.T, dims))
        s_all.append(np.full(len(sub), s))
    return np.concatenate(s_all), np.concatenate(x_all)
