"""Harmony's Algorithm 1, vectorised (Lee et al., Harmony, §IV-B).

The policy's view of the jobs: per job, COMP on ``m`` GPUs of one type is the
step-time model at local batch ``ceil(B/m)`` (eq. (2) through the affine step
time), COMM is the ring all-reduce on ``m`` GPUs (intra-node bandwidth while
``m`` fits a node). A group runs on GPUs of one type; its iteration is eq. (1),
its utilisation eq. (3), a grouping's eq. (4) counts idle GPUs as unused. GPU
memory bounds the members of a group (:func:`hetsched.core.colocation.job_memory_gb`
with a 3% margin). Everything here works on numpy arrays of the jobs in hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetsched.core.memory import job_state_gb, type_memory_gb
from hetsched.core.model import BITS_PER_MB
from hetsched.core.problem import PlanningProblem

#: fraction of a GPU's memory a group may plan to use (integer batches, per-node memory)
MEM_MARGIN = 0.97
#: fine-tuning swaps per grouping at most (the paper repeats until none helps)
MAX_SWAPS = 64
#: rounds of handing out the GPUs left after balancing (each round gives many at once)
SPEND_ROUNDS = 24
#: candidate group DoPs: every count up to 64, then geometric
DOP_GRID = np.unique(np.concatenate([np.arange(1, 65), np.round(64 * 1.15 ** np.arange(1, 80))]))


@dataclass
class Jobs:
    """Per-job arrays, each job on its reference GPU type (what Algorithm 1 groups on):
    the allowed type with the most free GPUs."""

    ids: np.ndarray     # problem job indices
    a: np.ndarray
    c: np.ndarray
    B: np.ndarray
    cap: np.ndarray
    mb: np.ndarray      # model size (MB) for the ring all-reduce; 0 = use sync
    sync: np.ndarray
    state: np.ndarray   # GB of model state
    mem_cap: np.ndarray  # local batch that fills the GPU alone (core.memory.fill_batch)
    lo: np.ndarray
    hi: np.ndarray
    gpu_gb: np.ndarray  # memory of one GPU of the job's type
    node: np.ndarray    # GPUs of one node of the job's type
    intra: float
    inter: float

    @classmethod
    def build(cls, p: PlanningProblem, ids: np.ndarray, free: np.ndarray) -> Jobs:
        mem = type_memory_gb(p.cluster, p.types)
        hi = np.minimum(p.hi[ids], p.B[ids]).astype(float)
        t = np.argmax(np.where(p.allowed[ids], free[None, :] + 1, 0), axis=1)
        return cls(ids, p.a[ids, t], p.c[ids, t], p.B[ids].astype(float),
                   p.cap[ids, t].astype(float), p.model_mb[ids], p.sync[ids, t],
                   np.array([job_state_gb(p.jobs[i]) for i in ids]), p.mem_cap[ids, t],
                   p.lo[ids].astype(float),
                   hi, mem[t], np.maximum(1, p.node_max[t]).astype(float),
                   p.cluster.intra_node_gbps, p.cluster.inter_node_gbps)

    def comp(self, m: np.ndarray | float) -> np.ndarray:
        """COMP seconds at DoP ``m`` (broadcast), eq. (2) through the step-time model."""
        return self.a + self.c * np.ceil(self.B / m)

    def comm(self, m: np.ndarray | float) -> np.ndarray:
        """COMM seconds at DoP ``m`` (broadcast): ring all-reduce, node-local while it fits."""
        m = np.asarray(m, dtype=float)
        bw = np.where(m <= self.node, self.intra, self.inter)
        ring = 2.0 * (m - 1) / m * self.mb * BITS_PER_MB / (bw * 1e9)
        return np.where(m <= 1, 0.0, np.where(self.mb > 0, ring, self.sync))

    def mem_coef(self) -> tuple[np.ndarray, np.ndarray]:
        """Per job (s, k): memory at DoP m is at most ``s + k / m`` (ceil(B/m) <= B/m + 1)."""
        per_sample = np.maximum(0.0, self.gpu_gb - self.state) / np.maximum(1.0, self.mem_cap)
        return self.state + per_sample, per_sample * self.B


@dataclass
class Grouping:
    """Groups (lists of positions into a Jobs), each with its DoP; ``u`` its eq. (4)."""

    members: list[np.ndarray]
    dop: np.ndarray
    u: tuple[float, float] = (0.0, 0.0)

    @property
    def n_jobs(self) -> int:
        return int(sum(len(g) for g in self.members))


def _flat(members: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenated members, each one's group, and each group's first offset (reduceat)."""
    sizes = np.array([len(g) for g in members], dtype=int)
    idx = np.concatenate(members).astype(int)
    return idx, np.repeat(np.arange(len(members)), sizes), np.concatenate([[0], np.cumsum(sizes)[:-1]])


def group_sums(J: Jobs, members: list[np.ndarray], dop: np.ndarray,
               flat: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: Σ comp, Σ comm, max job iteration at its DoP (``flat``: :func:`_flat`)."""
    if not members:
        z = np.zeros(0)
        return z, z, z
    idx, gid, starts = flat if flat is not None else _flat(members)
    m = dop[gid]
    cp = J.a[idx] + J.c[idx] * np.ceil(J.B[idx] / m)
    bw = np.where(m <= J.node[idx], J.intra, J.inter)
    ring = 2.0 * (m - 1) / m * J.mb[idx] * BITS_PER_MB / (bw * 1e9)
    cm = np.where(m <= 1, 0.0, np.where(J.mb[idx] > 0, ring, J.sync[idx]))
    return (np.add.reduceat(cp, starts), np.add.reduceat(cm, starts),
            np.maximum.reduceat(cp + cm, starts))


def utilisation(J: Jobs, g: Grouping, total: int) -> tuple[float, float]:
    """Eq. (3) per group, eq. (4) over ``total`` GPUs (idle ones count as unused)."""
    if not g.members or total <= 0:
        return (0.0, 0.0)
    sc, sm, mx = group_sums(J, g.members, g.dop)
    t = np.maximum(np.maximum(sc, sm), mx)
    t = np.where(t > 0, t, 1.0)
    return (float((g.dop * sc / t).sum() / total), float((g.dop * sm / t).sum() / total))


def min_dops(J: Jobs, members: list[np.ndarray]) -> np.ndarray:
    """Per group: fewest GPUs on which the members fit together (memory with a margin,
    batch caps, min_gpus); inf where none does (or more than a member may use)."""
    idx, _, starts = _flat(members)
    s, k = J.mem_coef()
    size = np.diff(np.append(starts, len(idx)))
    room = np.minimum.reduceat(J.gpu_gb[idx], starts) * MEM_MARGIN - np.add.reduceat(s[idx],
                                                                                     starts)
    with np.errstate(divide="ignore", invalid="ignore"):
        mem = np.where(room > 0, np.ceil(np.add.reduceat(k[idx], starts) / room), np.inf)
    mem = np.where(size == 1, 1.0, mem)
    need = np.maximum.reduce([mem, np.maximum.reduceat(np.ceil(J.B[idx] / J.cap[idx]), starts),
                              np.maximum.reduceat(J.lo[idx], starts), np.ones(len(members))])
    return np.where(need <= np.minimum.reduceat(J.hi[idx], starts), need, np.inf)


def min_dop(J: Jobs, members: np.ndarray) -> float:
    """:func:`min_dops` of one group."""
    return float(min_dops(J, [np.asarray(members)])[0])


def n_groups(J: Jobs, pos: np.ndarray, M: int, keep: int = 1) -> list[int]:
    """Algorithm 1 L6: the group counts whose equal DoP ``M / n_G`` best balance comp and
    comm, the ``keep`` best first."""
    n = min(len(pos), M)
    cand = np.unique(np.clip(np.round(np.geomspace(1, max(n, 1), 40)), 1, n)).astype(int)
    m = np.maximum(1, M // cand).astype(float)
    sub_a, sub_c, sub_B = J.a[pos][:, None], J.c[pos][:, None], J.B[pos][:, None]
    comp = sub_a + sub_c * np.ceil(sub_B / m[None, :])
    bw = np.where(m[None, :] <= J.node[pos][:, None], J.intra, J.inter)
    ring = 2.0 * (m - 1) / m * BITS_PER_MB / (bw * 1e9)
    comm = np.where(m[None, :] <= 1, 0.0, np.where(J.mb[pos][:, None] > 0,
                                                   J.mb[pos][:, None] * ring,
                                                   J.sync[pos][:, None]))
    order = np.argsort(np.abs(comp - comm).sum(axis=0), kind="stable")
    return [int(cand[k]) for k in order[:keep]]


def assign_jobs(J: Jobs, pos: np.ndarray, nG: int, M: int, tune_rounds: int = 0
                ) -> list[np.ndarray]:
    """Algorithm 1 L7: sort by iteration time, fill groups in order, fine-tune by swaps.

    Consecutive jobs of the sorted list share a group (large jobs stay
    together, avoiding job-bound groups). Fine-tuning swaps one job between
    the most imbalanced group and the most complementary one while that
    lowers both groups' imbalance ``|Σ comp - Σ comm|``.
    """
    m = max(1.0, M / nG)
    it = J.comp(m)[pos] + J.comm(m)[pos]
    order = pos[np.argsort(it, kind="stable")]
    groups = [g for g in np.array_split(order, nG) if len(g)]
    d = J.comp(m) - J.comm(m)
    D = np.array([d[g].sum() for g in groups]) if len(groups) < 64 else \
        np.add.reduceat(d[np.concatenate(groups)], _flat(groups)[2])
    for _ in range(tune_rounds or min(2 * len(groups), MAX_SWAPS)):
        g1 = int(np.argmax(np.abs(D)))
        opp = np.nonzero(np.sign(D) == -np.sign(D[g1]))[0]
        if D[g1] == 0 or not len(opp):
            break
        g2 = int(opp[np.argmax(np.abs(D[opp]))])
        da, db = d[groups[g1]][:, None], d[groups[g2]][None, :]
        after = np.abs(D[g1] - da + db) + np.abs(D[g2] - db + da)
        r, c = np.unravel_index(int(np.argmin(after)), after.shape)
        if after[r, c] >= abs(D[g1]) + abs(D[g2]) - 1e-12:
            break
        a, b = groups[g1][r], groups[g2][c]
        groups[g1] = np.where(groups[g1] == a, b, groups[g1])
        groups[g2] = np.where(groups[g2] == b, a, groups[g2])
        D[g1] += d[b] - d[a]
        D[g2] += d[a] - d[b]
    return groups


def allocate_machines(J: Jobs, groups: list[np.ndarray], M: int) -> Grouping:
    """Algorithm 1 L8: one GPU set per group, more to the computation-bound ones.

    Each group's balanced DoP (the smallest on the grid where Σ comp <= Σ comm,
    within its memory minimum and members' maximum) is what "give a GPU to the
    most computation-intensive group, repeatedly" converges to; when they do
    not all fit, DoPs shrink proportionally (never below a group's minimum) and
    groups that cannot get their minimum are left out (they wait).
    """
    if not groups:
        return Grouping([], np.zeros(0))
    mins = min_dops(J, groups)
    keep = np.nonzero(np.isfinite(mins))[0]
    groups, mins = [groups[k] for k in keep], mins[keep]
    if not groups:
        return Grouping([], np.zeros(0))
    flat = _flat(groups)
    his = np.minimum.reduceat(J.hi[flat[0]], flat[2])
    bal = _balanced(J, groups, flat, M)
    dop = np.clip(bal, mins, his)
    # the balanced DoP or the minimum, whichever keeps the group's GPUs busier (a GPU
    # alone has no all-reduce: the balance can cost more than it overlaps)
    flat_u = lambda m: _busy_share(J, groups, m, flat)  # noqa: E731
    dop = np.where(flat_u(mins) >= flat_u(dop), mins, dop)
    # the groups that fit at their minimum, in order
    fit = np.cumsum(mins) <= M
    groups = [g for g, f in zip(groups, fit, strict=True) if f]
    mins, dop, his = mins[fit], dop[fit], his[fit]
    if dop.sum() > M:
        extra = dop - mins
        dop = mins + np.floor(extra * (M - mins.sum()) / max(extra.sum(), 1e-12))
    return Grouping(groups, _spend(J, groups, dop.astype(float), his, M))


def _busy_share(J: Jobs, groups: list[np.ndarray], m: np.ndarray,
                flat: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """Eq. (3)'s GPU utilisation of each group at DoP ``m``."""
    sc, sm, mx = group_sums(J, groups, m, flat)
    return sc / np.maximum(np.maximum(np.maximum(sc, sm), mx), 1e-300)


def _balanced(J: Jobs, groups: list[np.ndarray], flat: tuple[np.ndarray, np.ndarray, np.ndarray],
              M: int) -> np.ndarray:
    """Per group, the smallest grid DoP where Σ comp <= Σ comm (the largest if none).

    Σ comp falls and Σ comm rises with the DoP, so a bisection over the grid,
    all groups at once, finds it in a few vectorised steps.
    """
    grid = DOP_GRID[DOP_GRID <= max(M, 1)].astype(float)
    lo = np.zeros(len(groups), dtype=int)
    hi = np.full(len(groups), len(grid) - 1)
    while (lo < hi).any():
        mid = (lo + hi) // 2
        sc, sm, _ = group_sums(J, groups, grid[mid], flat)
        ok = sc <= sm
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, np.minimum(mid + 1, hi))
    return grid[lo]


def _spend(J: Jobs, groups: list[np.ndarray], dop: np.ndarray, his: np.ndarray, M: int
           ) -> np.ndarray:
    """The GPUs left after balancing go where they raise eq. (4) most (idle ones count zero).

    Rounds give ``step`` more GPUs to each group whose GPU-weighted utilisation
    ``m * U_gpu`` gains most per GPU, the step shrinking as the GPUs run out.
    """
    flat = _flat(groups) if groups else None

    def busy(m: np.ndarray) -> np.ndarray:
        sc, sm, mx = group_sums(J, groups, m, flat)
        return m * sc / np.maximum(np.maximum(np.maximum(sc, sm), mx), 1e-300)

    left = M - int(dop.sum())
    if not groups or left <= 0:
        return dop
    now = busy(dop)
    takers = len(groups)
    for _ in range(SPEND_ROUNDS):
        if left <= 0:
            break
        step = max(1, left // (2 * takers))
        room = np.minimum(step, his - dop)
        trial = dop + room
        gain = np.where(room > 0, (busy(trial) - now) / np.maximum(room, 1), -np.inf)
        order = np.argsort(-gain, kind="stable")
        order = order[gain[order] > 1e-12]
        if not len(order):
            break
        took = np.cumsum(room[order]) <= left
        order = order[took] if took.any() else order[:0]
        if not len(order):
            break
        dop[order] = trial[order]
        now[order] = busy(dop)[order]
        left = M - int(dop.sum())
        takers = len(order)
    return dop


def _score(J: Jobs, g: Grouping, M: int) -> float:
    """GPU utilisation first (it makes the progress), the network's as a tie-break."""
    g.u = utilisation(J, g, M)
    return g.u[0] + 1e-3 * g.u[1]


def schedule(J: Jobs, pos: np.ndarray, M: int, grow: float = 1.25, patience: int = 3,
             tries: int = 3) -> Grouping:
    """Algorithm 1: grow the jobs considered (in order) while eq. (4)'s GPU utilisation rises.

    The paper adds one job per round and stops at the first round without a
    gain; rounds here add ``grow``-fold more (1, 2, 3, 4, 5, 6, 8, ...), which
    keeps 8,000 jobs in well under a second, and stop after ``patience``
    rounds without a gain (stopping at the first lost up to 40% of the
    exhaustive optimum's utilisation on small instances: the grouping of
    n + 1 jobs is not a refinement of that of n).
    """
    best = Grouping([], np.zeros(0))
    n, nj, idle = len(pos), 1, 0
    while M > 0 and nj <= n:
        sub = pos[:nj]
        # the paper's balanced count, and a few runners-up and one GPU per job: a GPU
        # alone has no all-reduce, which L6's balance cannot see
        counts = dict.fromkeys(n_groups(J, sub, M, tries) + [min(nj, M)])
        g = max((allocate_machines(J, assign_jobs(J, sub, nG, M), M) for nG in counts),
                key=lambda x: _score(J, x, M))
        if g.u[0] + 1e-3 * g.u[1] > best.u[0] + 1e-3 * best.u[1] + 1e-12:
            best, idle = g, 0
        elif nj > 1:
            idle += 1
            if idle >= patience:
                break
        if nj == n:
            break
        nj = min(n, max(nj + 1, int(nj * grow)))
    return best


__all__ = ["Jobs", "Grouping", "schedule", "utilisation", "min_dop", "assign_jobs",
           "allocate_machines", "n_groups", "group_sums", "MEM_MARGIN", "min_dops"]
