"""The pool-mode baselines of Hare's evaluation (section 7.1), on the same task model.

All four are *job-level* schedulers: a running job holds a fixed set of GPUs
(its gang) and runs its rounds back to back on it. That is the strict
scale-fixed synchronisation Hare relaxes: a round ends when the slowest
gang member has computed and synchronised, and the gang's GPUs wait idle for
it (they belong to the job). With ``g`` GPUs for ``P`` tasks, tasks are dealt
to the gang fastest GPU first (longest-processing-time rule), so a round of
``n`` iterations lasts ``n * D`` with ``D = max_g (tasks_g * t_g + s_g)``.

* ``fifo`` (Gavel_FIFO): jobs in arrival order; the head job waits until
  ``P`` GPUs are free and takes the fastest free ones (heterogeneity-aware
  placement, no backfilling, no preemption).
* ``srtf``: shortest remaining time first (on the job's best gang),
  preemptive at round boundaries: at every arrival and completion the jobs
  with the least remaining time that fit the pool are chosen; a running job
  that is not chosen stops at the end of its current round and resumes later.
* ``homo`` (Sched_Homo, Zhang et al.): weighted-shortest-first (Smith's rule)
  with intra-job parallelism, but heterogeneity-oblivious: it sizes jobs with
  the pool's mean GPU speed and takes free GPUs in cluster order; jobs never
  preempted.
* ``allox`` (Sched_Allox, Le et al.): one GPU per job (all P tasks of a round
  run on it in turn), heterogeneity-aware: at each event the waiting jobs are
  matched to (GPU, position-from-last) slots by a min-cost bipartite matching
  (cost ``busy_m + k * p_jm``, AlloX's average-JCT formulation); a free GPU
  starts the job matched first on it. No preemption.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from hetsched.planning.pool.evaluator import TaskSchedule
from hetsched.planning.pool.problem import PoolProblem

EPS = 1e-9


@dataclass
class _Run:
    """A job running on a gang from ``start`` at round ``r0``; rounds last ``n * D``."""

    gpus: list[int]
    layout: list[tuple[int, list[int]]]  # (gpu, task indices in order)
    D: float
    start: float
    r0: int
    stop_round: int | None = None


@dataclass
class _Seg:
    job: int
    layout: list[tuple[int, list[int]]]
    D: float
    start: float
    r0: int
    r1: int


@dataclass
class GangEngine:
    """Event loop shared by the job-level baselines; a policy's ``decide`` starts/stops jobs."""

    pp: PoolProblem
    rounds_done: np.ndarray = field(init=False)
    ready: np.ndarray = field(init=False)
    free: np.ndarray = field(init=False)
    running: dict[int, _Run] = field(init=False, default_factory=dict)
    done: np.ndarray = field(init=False)
    arrived: np.ndarray = field(init=False)
    segs: list[_Seg] = field(init=False, default_factory=list)
    t: float = 0.0

    def __post_init__(self) -> None:
        pp = self.pp
        self.rounds_done = np.zeros(pp.S, dtype=np.int64)
        self.ready = pp.arrival.astype(float).copy()
        self.free = np.ones(pp.K, dtype=bool)
        self.done = np.zeros(pp.S, dtype=bool)
        self.arrived = np.zeros(pp.S, dtype=bool)
        # GPUs sorted by speed for each job (fastest first), allowed ones only
        self._speed_order = [
            [int(g) for g in np.argsort(pp.t_it[i][pp.gpu_type], kind="stable")
             if pp.ok[i, pp.gpu_type[g]]] for i in range(pp.S)]

    # -- geometry of a gang --------------------------------------------
    def gang_size(self, i: int) -> int:
        return min(int(self.pp.P[i]), len(self._speed_order[i]))

    def layout(self, i: int, gpus: list[int]) -> tuple[float, list[tuple[int, list[int]]]]:
        """Deal the P tasks to the gang (LPT, fastest first); per-iteration round time D."""
        pp = self.pp
        t = [float(pp.t_it[i, pp.gpu_type[g]]) for g in gpus]
        s = [float(pp.s_it[i, pp.gpu_type[g]]) for g in gpus]
        load = [0.0] * len(gpus)
        tasks: list[list[int]] = [[] for _ in gpus]
        for k in range(int(pp.P[i])):
            j = min(range(len(gpus)), key=lambda q: (load[q] + t[q], q))
            load[j] += t[j]
            tasks[j].append(k)
        D = max(load[q] + s[q] for q in range(len(gpus)) if tasks[q])
        return D, [(gpus[q], tasks[q]) for q in range(len(gpus)) if tasks[q]]

    def best_D(self, i: int) -> float:
        """Round time per iteration on the job's fastest possible gang."""
        return self.layout(i, self._speed_order[i][: self.gang_size(i)])[0]

    def free_fastest(self, i: int, n: int) -> list[int] | None:
        """The n fastest free GPUs job i may use, or None if fewer are free."""
        got = [g for g in self._speed_order[i] if self.free[g]][:n]
        return got if len(got) == n else None

    def free_in_order(self, i: int, n: int) -> list[int] | None:
        """The first n free allowed GPUs in cluster order (heterogeneity-oblivious)."""
        ok = self.pp.ok[i]
        got = [g for g in range(self.pp.K) if self.free[g] and ok[self.pp.gpu_type[g]]][:n]
        return got if len(got) == n else None

    def remaining_iters(self, i: int) -> int:
        pp = self.pp
        r = int(self.rounds_done[i])
        if r >= int(pp.R[i]):
            return 0
        return int(pp.total_iters[i]) - r * int(pp.N[i])

    # -- running ---------------------------------------------------------
    def start(self, i: int, gpus: list[int]) -> None:
        D, lay = self.layout(i, gpus)
        st = max(self.t, float(self.ready[i]))
        self.running[i] = _Run(gpus, lay, D, st, int(self.rounds_done[i]))
        self.free[gpus] = False

    def _round_start(self, i: int, run: _Run, r: int) -> float:
        return run.start + (r - run.r0) * float(self.pp.N[i]) * run.D

    def end_time(self, i: int, run: _Run) -> float:
        R = int(self.pp.R[i])
        if run.stop_round is not None:
            return self._round_start(i, run, run.stop_round)
        return self._round_start(i, run, R - 1) + float(self.pp.last[i]) * run.D

    def stop(self, i: int) -> None:
        """Stop job i at its next round boundary (no-op if it would finish first)."""
        run = self.running[i]
        R = int(self.pp.R[i])
        per = float(self.pp.N[i]) * run.D
        rb = run.r0 + max(1, math.ceil((self.t - run.start) / per - 1e-9))
        if rb <= R - 1:
            run.stop_round = rb

    def _finish(self, i: int, run: _Run, r1: int, t_end: float) -> None:
        if r1 > run.r0:
            self.segs.append(_Seg(i, run.layout, run.D, run.start, run.r0, r1))
        self.free[run.gpus] = True
        self.rounds_done[i] = r1
        self.ready[i] = t_end
        if r1 >= int(self.pp.R[i]):
            self.done[i] = True
        del self.running[i]

    def run(self, decide: Callable[[GangEngine], None]) -> None:
        pp = self.pp
        order = np.argsort(pp.arrival, kind="stable")
        nxt = 0
        self.t = float(pp.arrival[order[0]])
        while not self.done.all():
            for i, run in list(self.running.items()):
                te = self.end_time(i, run)
                if te <= self.t + EPS * max(1.0, abs(te)):
                    r1 = run.stop_round if run.stop_round is not None else int(pp.R[i])
                    self._finish(i, run, r1, te)
            while nxt < pp.S and pp.arrival[order[nxt]] <= self.t + EPS:
                self.arrived[order[nxt]] = True
                nxt += 1
            if self.done.all():
                break
            decide(self)
            t_arr = float(pp.arrival[order[nxt]]) if nxt < pp.S else math.inf
            t_run = min((self.end_time(i, r) for i, r in self.running.items()), default=math.inf)
            t_next = min(t_arr, t_run)
            if not math.isfinite(t_next):
                stuck = [pp.base.jobs[i].name for i in range(pp.S) if not self.done[i]]
                raise AssertionError(f"baseline cannot place {', '.join(stuck[:5])}")
            self.t = max(self.t, t_next)

    def waiting(self) -> list[int]:
        return [i for i in range(self.pp.S)
                if self.arrived[i] and not self.done[i] and i not in self.running]

    # -- output ----------------------------------------------------------
    def schedule(self, policy: str) -> TaskSchedule:
        pp = self.pp
        js, rs, ks, gs, ss = [], [], [], [], []
        for sg in self.segs:
            i = sg.job
            N = float(pp.N[i])
            r = np.arange(sg.r0, sg.r1)
            rstart = sg.start + (r - sg.r0) * N * sg.D
            n = pp.round_iters_array(np.full(len(r), i), r).astype(float)
            for g, tasks in sg.layout:
                tg = float(pp.t_it[i, pp.gpu_type[g]])
                for pos, k in enumerate(tasks):
                    js.append(np.full(len(r), i))
                    rs.append(r)
                    ks.append(np.full(len(r), k))
                    gs.append(np.full(len(r), g))
                    ss.append(rstart + pos * n * tg)
        cat = np.concatenate
        return TaskSchedule(cat(js).astype(np.int64), cat(rs).astype(np.int64),
                            cat(ks).astype(np.int64), cat(gs).astype(np.int64),
                            cat(ss).astype(float), policy=policy)


# ---------------------------------------------------------------------------
# policies


def fifo(pp: PoolProblem) -> TaskSchedule:
    """Gavel_FIFO: strict arrival order, fastest free GPUs, the head waits for its P GPUs."""
    def decide(e: GangEngine) -> None:
        for i in sorted(e.waiting(), key=lambda j: (float(pp.arrival[j]), j)):
            gpus = e.free_fastest(i, e.gang_size(i))
            if gpus is None:
                return  # head-of-line blocking
            e.start(i, gpus)

    eng = GangEngine(pp)
    eng.run(decide)
    return eng.schedule("fifo")


def srtf(pp: PoolProblem) -> TaskSchedule:
    """Shortest remaining time first, preemptive at round boundaries."""
    eng = GangEngine(pp)
    bestD = np.array([eng.best_D(i) for i in range(pp.S)])

    def decide(e: GangEngine) -> None:
        active = e.waiting() + list(e.running)
        active.sort(key=lambda j: (e.remaining_iters(j) * bestD[j], j))
        cap = pp.K
        chosen: list[int] = []
        for i in active:
            need = e.gang_size(i)
            if need <= cap:
                chosen.append(i)
                cap -= need
        cs = set(chosen)
        for i, run in e.running.items():
            if i in cs:
                run.stop_round = None  # chosen again: keep running
            elif run.stop_round is None:
                e.stop(i)
        for i in chosen:
            if i not in e.running:
                gpus = e.free_fastest(i, e.gang_size(i))
                if gpus is not None:
                    e.start(i, gpus)

    eng.run(decide)
    return eng.schedule("srtf")


def homo(pp: PoolProblem) -> TaskSchedule:
    """Sched_Homo: Smith's rule on a homogeneous speed model, free GPUs in cluster order."""
    eng = GangEngine(pp)
    cnt = pp.n_type_gpus.astype(float)
    # heterogeneity-oblivious size: the pool's mean per-iteration time
    mean_t = np.array([float((np.where(pp.ok[i], pp.t_it[i], 0) * cnt).sum()
                             / cnt[pp.ok[i]].sum()) for i in range(pp.S)])
    mean_s = np.array([float(pp.s_it[i][pp.ok[i]].mean()) for i in range(pp.S)])

    def decide(e: GangEngine) -> None:
        def prio(j: int) -> tuple[float, int]:
            g = e.gang_size(j)
            size = e.remaining_iters(j) * (math.ceil(int(pp.P[j]) / g) * mean_t[j] + mean_s[j])
            return (-float(pp.weight[j]) / size, j)

        for i in sorted(e.waiting(), key=prio):
            gpus = e.free_in_order(i, e.gang_size(i))
            if gpus is not None:
                e.start(i, gpus)

    eng.run(decide)
    return eng.schedule("homo")


def allox(pp: PoolProblem) -> TaskSchedule:
    """Sched_Allox: one GPU per job, min-cost matching of jobs to (GPU, position) slots."""
    eng = GangEngine(pp)
    # per job x GPU: round time per iteration on that one GPU (P tasks in turn + sync)
    Dg = np.where(pp.ok[:, pp.gpu_type],
                  pp.P[:, None] * pp.t_it[:, pp.gpu_type] + pp.s_it[:, pp.gpu_type], np.inf)
    BIG = 1e30

    def decide(e: GangEngine) -> None:
        wait = e.waiting()
        if not wait or not e.free.any():
            return
        K = pp.K
        busy = np.zeros(K)
        for i, run in e.running.items():
            busy[run.gpus] = max(0.0, e.end_time(i, run) - e.t)
        kp = math.ceil(len(wait) / K) + 1
        rem = np.array([e.remaining_iters(j) for j in wait], dtype=float)
        p = rem[:, None] * Dg[wait]  # (W, K)
        k = np.arange(1, kp + 1, dtype=float)
        cost = busy[None, :, None] + p[:, :, None] * k[None, None, :]  # (W, K, kp)
        cost = np.where(np.isfinite(cost), cost, BIG).reshape(len(wait), K * kp)
        rows, cols = linear_sum_assignment(cost)
        first: dict[int, tuple[int, int]] = {}  # gpu -> (position from last, job)
        for r, c in zip(rows, cols, strict=True):
            if cost[r, c] >= BIG:
                continue
            g, pos = divmod(int(c), kp)
            if e.free[g] and (g not in first or pos > first[g][0]):
                first[g] = (pos, wait[r])
        for g, (_, j) in first.items():
            e.start(j, [g])

    eng.run(decide)
    return eng.schedule("allox")


BASELINES = {"fifo": fifo, "srtf": srtf, "homo": homo, "allox": allox}
