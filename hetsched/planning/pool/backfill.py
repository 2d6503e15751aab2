"""Improve a task plan where time sharing helps: fill GPU time it leaves idle.

Starting from a feasible task plan with uneven tasks (the space plan's exact
task plan, :mod:`.from_space`), three kinds of move, each kept only when the
evaluator says the total weighted JCT went down:

1. **left shift**: every task at its earliest time in the plan's order on its
   GPU (:func:`~.from_space.retime` without releases). It removes the space
   plan's restart gaps (pool mode switches tasks, it does not restart jobs) and
   whatever waiting those gaps caused downstream; it never moves a task later.
2. **backfill**: a job's rounds that run while an allowed GPU sits idle (before
   another job arrives, after one ends, or never given to anyone because the
   space plan capped a job's GPU count) get one more task there (or, when that
   does not pay and the idle GPU is faster, their slowest worker moves to it), and the
   round's global batch is split again over its workers (balanced shares, the
   space planner's rule; never beyond the job's GPU cap, ``max_gpus``); the plan
   is then re-timed in its order. Rounds are
   tried block by block (a block: consecutive rounds of a job on one worker
   set), the blocks of the heaviest jobs first, each with the fastest GPUs that
   are idle through most of its rounds.
3. **re-placement into the gaps** (:mod:`.reinsert`): a job that waits while
   GPUs it may use sit idle is taken out and put back into the time the other
   jobs leave free, its round's tasks in turn where fewer GPUs are free.

The search is bounded by counted work (tasks placed by the re-timing), never by
the clock, so the same input gives the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hetsched.core.model import SharesError, balanced_shares
from hetsched.planning.pool.evaluator import Evaluation, TaskSchedule, by_gpu, evaluate
from hetsched.planning.pool.from_space import retime
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.reinsert import reinsert_jobs

#: re-timings (each places every task once) the backfill may spend, in all
MAX_TRIES = 64
#: ... and tasks placed, in all (bounds large plans)
MAX_WORK = 2_000_000
#: GPUs tried per block
CANDIDATES = 2


@dataclass
class Improved:
    schedule: TaskSchedule
    objective: float
    tries: int
    accepted: int
    #: jobs re-placed into the gaps (:mod:`.reinsert`)
    reinserted: int = 0


def left_shift(pp: PoolProblem, s: TaskSchedule) -> TaskSchedule:
    """Every task at its earliest time, in the plan's order (never later)."""
    return replace(s, start=retime(pp, s, np.asarray(s.start, dtype=float)))


def improve(pp: PoolProblem, s: TaskSchedule) -> Improved:
    """Left shift, backfill idle GPUs, then re-place waiting jobs into the gaps
    (:mod:`.reinsert`); every kept move lowers the objective."""
    im = _backfill(pp, s)
    ri = reinsert_jobs(pp, im.schedule)
    if ri.objective < im.objective:
        return replace(im, schedule=ri.schedule, objective=ri.objective, reinserted=ri.accepted)
    return im


def _backfill(pp: PoolProblem, s: TaskSchedule) -> Improved:
    """Left shift, then backfill idle GPUs; every kept move lowers the objective."""
    best = s
    best_v = evaluate(pp, s).objective
    ls = left_shift(pp, s)
    v = evaluate(pp, ls).objective
    if v < best_v:
        best, best_v = ls, v
    tries = accepted = work = 0
    st = _State(pp, best, evaluate(pp, best))
    for blk in _blocks(pp, best):
        for g, rounds in st.candidates(blk):
            kept = False
            for move in (_add_gpu, _move_gpu):
                if tries >= MAX_TRIES or work + len(best.job) > MAX_WORK:
                    return Improved(best, best_v, tries, accepted)
                cand = move(pp, best, st.table, rounds, g)
                if cand is None:
                    continue
                tries += 1
                work += len(cand.job)
                ev = evaluate(pp, cand)
                if ev.objective < best_v - 1e-9 * max(1.0, abs(best_v)):
                    best, best_v, accepted, kept = cand, ev.objective, accepted + 1, True
                    st = _State(pp, best, ev)
                    break
            if kept:
                break
    return Improved(best, best_v, tries, accepted)


class _State:
    """A plan's rounds, windows and per-GPU busy intervals (rebuilt after each move)."""

    def __init__(self, pp: PoolProblem, s: TaskSchedule, ev: Evaluation) -> None:
        self.pp, self.s = pp, s
        self.table, rid = _round_table(s)
        start = np.asarray(s.start, dtype=float)
        lo = np.full(len(self.table), np.inf)
        hi = np.full(len(self.table), -np.inf)
        np.minimum.at(lo, rid, start)
        np.maximum.at(hi, rid, ev.sync_end)
        self.win = dict(zip(self.table, zip(lo.tolist(), hi.tolist(), strict=True),
                            strict=True))
        self.busy = by_gpu(pp.K, start, ev.end, np.asarray(s.gpu))

    def candidates(self, blk: list[tuple[int, int]]) -> list[tuple[int, list[tuple[int, int]]]]:
        """Up to CANDIDATES (GPU, rounds of the block during which it is idle): GPUs the
        job may use outside its worker set, most idle rounds (times speed) first."""
        pp, s = self.pp, self.s
        p = pp.base
        j = blk[0][0]
        used = {int(s.gpu[k]) for k in self.table[blk[0]]}
        if len(used) >= int(p.hi[j]):  # the job's GPU cap (max_gpus, its batch)
            return []
        win = np.array([self.win[jr] for jr in blk])
        rate = p.per_gpu_rate(j)
        scored = []
        for g in range(pp.K):
            t = int(pp.gpu_type[g])
            if g in used or not p.allowed[j, t]:
                continue
            st, en = self.busy[g]
            if len(st) == 0:
                idle = np.ones(len(win), dtype=bool)
            else:
                idx = np.searchsorted(st, win[:, 1] - 1e-9, side="left")
                idle = (idx == 0) | (en[np.maximum(idx - 1, 0)] <= win[:, 0] + 1e-9)
            if idle.any():
                scored.append((-float(idle.sum()) * float(rate[t]), g, idle))
        scored.sort(key=lambda x: (x[0], x[1]))
        return [(g, [jr for jr, ok in zip(blk, idle.tolist(), strict=True) if ok])
                for _, g, idle in scored[:CANDIDATES]]


def _round_table(s: TaskSchedule) -> tuple[dict[tuple[int, int], list[int]], np.ndarray]:
    """(job, round) -> its task rows in task order (job by job, rounds in order), and
    each task's position among those rounds."""
    job, rnd = np.asarray(s.job, dtype=np.int64), np.asarray(s.rnd, dtype=np.int64)
    order = np.lexsort((np.asarray(s.task), rnd, job))
    key = job[order] * (int(rnd.max()) + 1) + rnd[order]
    _, first, counts = np.unique(key, return_index=True, return_counts=True)
    ol = order.tolist()
    fl, cl = first.tolist(), counts.tolist()
    jl, rl = job[order[first]].tolist(), rnd[order[first]].tolist()
    table = {(j, r): ol[a:a + c] for j, r, a, c in zip(jl, rl, fl, cl, strict=True)}
    rid = np.empty(len(ol), dtype=np.int64)
    rid[order] = np.repeat(np.arange(len(fl)), counts)
    return table, rid


def _blocks(pp: PoolProblem, s: TaskSchedule) -> list[list[tuple[int, int]]]:
    """Runs of consecutive rounds of a job on one worker set, heaviest jobs first."""
    assert s.batch is not None
    gpu, batch = np.asarray(s.gpu).tolist(), np.asarray(s.batch).tolist()
    out: list[tuple[float, int, list[tuple[int, int]]]] = []
    prev: tuple[int, tuple[tuple[int, int], ...]] | None = None
    for (j, r), rows in _round_table(s)[0].items():
        sig = (j, tuple((gpu[k], batch[k]) for k in rows))
        if sig == prev:
            out[-1][2].append((j, r))
        else:
            out.append((-float(pp.weight[j]), len(out), [(j, r)]))
        prev = sig
    out.sort(key=lambda x: (x[0], x[1]))
    return [b for _, _, b in out]


def _shares(pp: PoolProblem, j: int, types: list[int]) -> list[int] | None:
    """Balanced local batches of job j over workers of ``types`` (None: they cannot)."""
    p = pp.base
    curves = p.curves[j]
    cv = None if curves is None else [curves[t] for t in types]
    try:
        return balanced_shares([float(p.a[j, t]) for t in types],
                               [float(p.c[j, t]) for t in types],
                               [int(p.cap[j, t]) for t in types], int(p.B[j]), cv)
    except SharesError:
        return None


def _faster(pp: PoolProblem, j: int, old: list[int], new: list[int], shares_old: list[int],
            shares_new: list[int]) -> bool:
    """Whether job j's iteration on GPUs ``new`` at ``shares_new`` is shorter than on ``old``
    (slowest step plus the worker set's sync, one per round of N iterations; the node
    layout taken as it is now)."""
    from hetsched.planning.pool.parallelism import sync_s
    from hetsched.planning.pool.uneven import fused_iterations_s, gpu_nodes

    nodes = gpu_nodes(pp)
    n = int(pp.N[j])

    def it(gs: list[int], b: list[int]) -> float:
        g = np.array(gs, dtype=np.int64)
        typ = pp.gpu_type[g]
        step = fused_iterations_s(pp, np.full(len(g), j), typ, np.array(b, dtype=np.int64),
                                  np.full(len(g), n)) / n
        sync = sync_s(pp.base, j, typ.tolist(), len(g), len(set(nodes[g].tolist())) == 1)
        return float(step.max()) + sync / n

    return it(new, shares_new) < it(old, shares_old) * (1 - 1e-6)


def _move_gpu(pp: PoolProblem, s: TaskSchedule, table: dict[tuple[int, int], list[int]],
              blk: list[tuple[int, int]], g: int) -> TaskSchedule | None:
    """``s`` with the block's slowest worker replaced by the faster GPU g in each round of
    ``blk``, batches re-split, re-timed (None: g is not faster)."""
    assert s.batch is not None
    j = blk[0][0]
    first = table[blk[0]]
    rate = pp.base.per_gpu_rate(j)
    types = [int(pp.gpu_type[int(s.gpu[k])]) for k in first]
    slow = min(range(len(types)), key=lambda k: (rate[types[k]], k))
    tg = int(pp.gpu_type[g])
    if rate[tg] <= rate[types[slow]]:
        return None
    types[slow] = tg
    shares = _shares(pp, j, types)
    old = [int(s.gpu[k]) for k in first]
    new_g = old[:slow] + [g] + old[slow + 1:]
    if shares is None or not _faster(pp, j, old, new_g, [int(s.batch[k]) for k in first],
                                     shares):
        return None
    batch = np.asarray(s.batch, dtype=np.int64).copy()
    gpu = np.asarray(s.gpu, dtype=np.int64).copy()
    for jr in blk:
        rows = table[jr]
        batch[rows] = shares
        gpu[rows[slow]] = g
    new = replace(s, gpu=gpu, batch=batch, params=dict(s.params))
    new.start = retime(pp, new, np.asarray(s.start, dtype=float))
    return new


def _add_gpu(pp: PoolProblem, s: TaskSchedule, table: dict[tuple[int, int], list[int]],
             blk: list[tuple[int, int]], g: int) -> TaskSchedule | None:
    """``s`` with one more task on GPU g in each round of ``blk`` (rounds of one job on
    one worker set), their batches re-split, re-timed in the plan's order."""
    assert s.batch is not None and s.iters is not None
    j = blk[0][0]
    first = table[blk[0]]
    types = [int(pp.gpu_type[int(s.gpu[k])]) for k in first] + [int(pp.gpu_type[g])]
    shares = _shares(pp, j, types)
    old = [int(s.gpu[k]) for k in first]
    if shares is None or not _faster(pp, j, old, old + [g], [int(s.batch[k]) for k in first],
                                     shares):
        return None
    batch = np.asarray(s.batch, dtype=np.int64).copy()
    add: list[list[float]] = [[] for _ in range(7)]
    for jr in blk:
        rows = table[jr]
        batch[rows] = shares[:-1]
        k0 = rows[0]
        for col, v in zip(add, (j, jr[1], len(rows), g, shares[-1], int(s.iters[k0]),
                                float(s.start[k0])), strict=True):
            col.append(v)
    job, rnd, task, gp, bt, it = (np.concatenate([np.asarray(x, dtype=np.int64),
                                                  np.array(a, dtype=np.int64)])
                                  for x, a in zip((s.job, s.rnd, s.task, s.gpu, batch, s.iters),
                                                  add[:6], strict=True))
    key = np.concatenate([np.asarray(s.start, dtype=float), np.array(add[6])])
    new = TaskSchedule(job, rnd, task, gp, key, policy=s.policy, params=dict(s.params),
                       batch=bt, iters=it)
    new.start = retime(pp, new, key)
    return new


__all__ = ["Improved", "improve", "left_shift"]
