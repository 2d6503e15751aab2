"""ONES (Bian et al., "Online Evolutionary Batch Size Orchestration", SC 2021), Sec. 3.

An online evolutionary search over schedules that give each job GPUs *and*
a global batch (elastic jobs; a fixed-batch job keeps its batch and gets
GPUs only). The population persists across decisions and evolves with the
paper's four operations: *refresh* (drop finished jobs, scale down jobs
over their batch limit, place new jobs, taking GPUs from the job with the
largest batch if needed, fill idle GPUs by sampling jobs by utilization
gain), *uniform crossover* (each GPU from one parent or the other),
*uniform mutation* (each job preempted with the mutation rate, its GPUs
refilled; batches doubled or halved at the same rate) and *reorder*. The
new population is the best candidates by expected SRUF utilization (eq. 8)
over Beta draws of remaining work (:mod:`.ones_predict`), the best always
kept, the rest sampled (crossover, mutation, selection and the score live
in :mod:`.ones_search`). Batch-size limits (Sec. 3.3.2): a new job starts
within one GPU; a running job's limit doubles per epoch; a waiting job's
halves each decision it is rejected; a job that has run longer than the
mean inter-arrival time (ONES's 1/lambda) is halved once per such period.
The schedule changes only when every running job finished an epoch since
its last change; in between, only free GPUs are given out. Seeded: the same
seed gives the same plan.
"""

from __future__ import annotations

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.policies.base import Policy, Snapshot, register
from hetsched.planning.space.policies.common import fastest_types, largest_memory_types
from hetsched.planning.space.policies.ones_predict import Remaining, fit_history
from hetsched.planning.space.policies.ones_search import (
    Cand,
    Model,
    crossover,
    mutate,
    reorder,
    repair,
    select,
    sruf,
)


@register
class Ones(Policy):
    name = "ones"
    paper = "Bian et al., SC 2021 (ONES), Sec. 3; efficiency: Qiao et al., OSDI 2021 (Pollux)"
    summary = "Evolutionary search over GPUs and elastic batch sizes, SRUF selection"
    decides_batch = True
    uses_progress_history = True  # PlanningProblem.progress_history (the state store's)
    auto = False  # not for fixed-batch jobs: it changes batch sizes
    auto_elastic = True  # auto runs it when some job is elastic (planning/planner.py)
    #: counted work per event (auto's budget): a population of candidates scored per event
    EVENT_S, JOB_S = 4e-3, 4e-4
    param_docs = {
        "seed": "random seed (the same seed gives the same plan)",
        "population": "candidate schedules kept (0: one per GPU as the paper, at most 16)",
        "generations": "evolution rounds per decision",
        "mutation_rate": "probability a job is preempted / its batch changed in a mutation",
        "samples": "Beta draws of remaining work per score",
        "tick_s": "seconds between decisions besides arrivals and completions",
        "restart_s": "restart cost the score charges a moved job (-1: the evaluator's)",
        "efficiency": "score progress in efficient samples (gradient noise scale) if known",
        "grow_faster": "fill idle GPUs only with scale-ups that finish the job sooner",
        "keep_fixed": "start from the best fixed-batch plan (auto over the fixed-batch "
                      "policies) and keep it unless the search finds a better one "
                      "(False: the paper's search alone)",
    }

    def __init__(self, *, seed: int = 0, population: int = 0, generations: int = 3,
                 mutation_rate: float = 0.2, samples: int = 8, tick_s: float = 120.0,
                 restart_s: float = -1.0, efficiency: bool = True,
                 grow_faster: bool = True, keep_fixed: bool = True) -> None:
        if population < 0 or generations < 1 or samples < 1 or tick_s <= 0:
            raise ValueError("population >= 0, generations >= 1, samples >= 1, tick_s > 0")
        if not 0 <= mutation_rate <= 1:
            raise ValueError(f"mutation_rate must be in [0, 1], got {mutation_rate}")
        self.seed, self.population, self.generations = int(seed), int(population), generations
        self.mutation_rate, self.samples, self.tick_s = mutation_rate, samples, tick_s
        self.restart_s, self.efficiency = restart_s, bool(efficiency)
        self.grow_faster = bool(grow_faster)
        self.keep_fixed = bool(keep_fixed)
        self._problem: PlanningProblem | None = None

    # -- state -------------------------------------------------------------
    def _reset(self, p: PlanningProblem) -> None:
        self._problem = p
        self.m = Model(p, self.efficiency)
        self.rng = np.random.default_rng(self.seed)
        self.pop: list[Cand] = []
        self._rem_seen: dict[int, float] = {}
        self._wake_s = self.tick_s
        self.batch: dict[int, int] = {}
        self.limit: dict[int, int] = {}
        self.max_gpus: dict[int, int] = {}
        self.mark: dict[int, float] = {}  # remaining work at the job's last change
        self.epoch_mark: dict[int, float] = {}  # remaining at the last limit doubling
        self.exec_s: dict[int, float] = {}
        self.penalties: dict[int, int] = {}
        self.last_t = 0.0
        # ONES's gamma = 1/lambda, the mean time between arrivals; a decision interval
        # at least, or a burst of arrivals would penalise every job at once
        arr = np.sort(p.arrival)
        self.gamma = max(float(np.mean(np.diff(arr))), self.tick_s) \
            if len(arr) > 1 and arr[-1] > arr[0] else np.inf
        # the progress predictor, fitted on completed jobs from the state store
        self.remaining = Remaining(p, fit_history(p.progress_history, self.seed))
        self.n_pop = self.population or min(16, max(4, self.m.K))

    @classmethod
    def predict_work(cls, problem: PlanningProblem, active: list[int],
                     horizon_s: float = 0.0) -> float:
        """As every policy, plus one decision per default ``tick_s`` (120 s) over the
        horizon, with the mean number of active jobs."""
        base = super().predict_work(problem, active, horizon_s)
        mean = float(np.mean(active)) if len(active) else 0.0
        return base + (horizon_s / 120.0) * (cls.EVENT_S + cls.JOB_S * mean)

    def batch_for(self, i: int) -> int:
        return self.batch[i]

    def plan_extra(self) -> dict[str, object]:
        """Plan.extra["ones"]: how many completed-job epochs the progress predictor learnt from."""
        model = self.remaining.model if self._problem is not None else None
        return {"ones": {"predictor_points": model.n_train if model is not None else 0}}

    def next_wakeup(self, t: float) -> float:
        """Decide again ``tick_s`` later while jobs run (epochs end between arrivals).

        While no running job makes progress (all restarting), the interval doubles:
        a long restart must not cost one evolutionary search per tick (arrivals and
        completions still wake the policy at once).
        """
        return t + self._wake_s if getattr(self, "_placed", False) else float("inf")

    def _spe(self, i: int) -> float:
        return float(self._problem.jobs[i].steps_per_epoch) if self._problem else 1.0

    # -- batch-size limit rules (Sec. 3.3.2) --------------------------------
    def _limits(self, snap: Snapshot, running: set[int], update: bool) -> None:
        p = self.m.p
        dt = snap.t - self.last_t
        waiting = len(snap.jobs) > len(running)
        for r, i in enumerate(int(j) for j in snap.jobs):
            blo, bhi = self.m.batch_range(i)
            B0 = int(p.B[i])
            rem = float(snap.remaining[r])
            if i not in self.limit:  # start: within one GPU until it has run an epoch
                # (on its min_gpus, or on as few as hold its min_batch, if more)
                caps = np.sort(np.repeat(p.cap[i][p.allowed[i]], p.n_type[p.allowed[i]]))[::-1]
                first = max(1, int(p.lo[i]), int(np.searchsorted(np.cumsum(caps), blo)) + 1)
                self.limit[i] = max(blo, min(bhi, int(caps[:first].sum())))
                self.max_gpus[i] = first if p.jobs[i].elastic is not None else int(p.hi[i])
                self.epoch_mark[i] = rem
                self.exec_s[i] = 0.0
                continue
            if i in running:
                self.exec_s[i] += dt
                while self.epoch_mark[i] - rem >= self._spe(i) - 1e-9:  # scale-up per epoch
                    self.epoch_mark[i] -= self._spe(i)
                    self.limit[i] = min(bhi, 2 * self.limit[i])
                    self.max_gpus[i] = int(p.hi[i])
                periods = int(self.exec_s[i] / self.gamma) if np.isfinite(self.gamma) else 0
                if waiting and update and self.penalties.get(i, 0) < periods:
                    # scale-down of a long job while others wait (the convoy effect):
                    # halve, once per update, not below the batch the user tuned
                    self.penalties[i] = periods
                    self.limit[i] = max(blo, min(self.limit[i], max(self.limit[i] // 2, B0)))
            elif update and i in self.batch:  # resume: rejected again -> halve
                self.limit[i] = max(blo, min(self.limit[i], max(self.limit[i] // 2, B0)))
                self.epoch_mark[i] = rem
        self.last_t = snap.t

    # -- the decision ------------------------------------------------------
    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        if self._problem is not problem:
            self._reset(problem)
        m = self.m
        jobs = np.asarray(snap.jobs, dtype=int)
        running = {int(i) for r, i in enumerate(jobs) if snap.current[r].sum() > 0}
        self._rem_now = {int(i): float(snap.remaining[r]) for r, i in enumerate(jobs)}
        last = getattr(self, "_rem_seen", {})
        moved = not last or any(v < last.get(i, np.inf) - 1e-9 for i, v in self._rem_now.items())
        self._wake_s = self.tick_s if moved else min(2.0 * getattr(self, "_wake_s", self.tick_s),
                                                      1e9)
        self._rem_seen = dict(self._rem_now)
        update = all(self.mark.get(i, np.inf) - float(snap.remaining[r]) >= self._spe(i) - 1e-9
                     for r, i in enumerate(jobs) if int(i) in running)
        self._limits(snap, running, update)
        cur = self._current(snap, jobs)
        frozen = set() if update else running
        curkey = {i: (tuple(m.counts(cur, i).tolist()), cur.batch[i]) for i in running}
        draws = self.remaining.draw(np.random.default_rng([self.seed, int(snap.t * 1000)]),
                                    jobs, snap.remaining, self.samples)
        wait_t = {}
        for i in (int(j) for j in jobs):
            n = self._min_set(i, problem.n_type)
            if n.sum():
                lo, hi = m.feasible_batches(i, n, self.limit.get(i))
                wait_t[i] = (int(n.sum()), m.per_work(i, n, hi))
            else:
                wait_t[i] = (1, 1e9)

        rc = self._rc = self.restart_s if self.restart_s >= 0 else \
            snap.restart_cost_s if snap.restart_cost_s is not None else 60.0
        self._curkey = curkey

        def score(c: Cand) -> float:
            return sruf(m, c, jobs, draws, curkey, rc, wait_t)

        active = set(int(i) for i in jobs)
        pop = [self._refresh(c, cur, active, running, frozen, jobs, draws) for c in self.pop]
        pop.append(self._refresh(cur.copy(), cur, active, running, frozen, jobs, draws))
        # the incumbent: every running job kept as it is, new jobs on free GPUs only (the
        # choice SRUF must be able to make when moving a running job costs more than it saves)
        pop.append(self._refresh(cur.copy(), cur, active, running, running, jobs, draws))
        while len(pop) < self.n_pop:  # initial population: a random job on each GPU
            c = cur.copy()
            free = np.nonzero(c.owner == -1)[0]
            if len(free):
                c.owner[self.rng.choice(free)] = int(self.rng.choice(jobs))
            pop.append(self._refresh(c, cur, active, running, frozen, jobs, draws))
        for _ in range(self.generations):
            kids: list[Cand] = []
            order = self.rng.permutation(len(pop))
            for a, b in zip(order[0::2], order[1::2], strict=False):
                kids += crossover(self.rng, m.K, pop[a], pop[b])
            for j in self.rng.choice(len(pop), size=max(1, len(pop) // 2), replace=False):
                kids.append(mutate(self.rng, self.mutation_rate, pop[int(j)], frozen))
            kids = [self._fill(reorder(m, repair(m, self._impose(k, cur, frozen), self.limit,
                                                 self.max_gpus, frozen)), jobs, draws, frozen)
                    for k in kids]
            pop = select(self.rng, m, self.n_pop, pop + kids, score)
        self.pop = pop
        X = self._emit(pop[0], jobs, running, cur)
        self._placed = bool(X.sum())
        return X

    def _current(self, snap: Snapshot, jobs: np.ndarray) -> Cand:
        m = self.m
        owner = np.full(m.K, -1, dtype=int)
        start = np.concatenate([[0], np.cumsum(m.p.n_type)[:-1]])
        used = np.zeros(m.p.T, dtype=int)
        batch = {}
        for r, i in enumerate(jobs):
            for t, k in enumerate(snap.current[r]):
                owner[start[t] + used[t]:start[t] + used[t] + int(k)] = int(i)
                used[t] += int(k)
            if snap.current[r].sum():
                batch[int(i)] = self.batch.get(int(i), int(m.p.B[int(i)]))
        # GPUs neither free nor held by these jobs (others' GPUs): blocked slots, -2
        blocked = m.p.n_type - np.asarray(snap.free) - snap.current.sum(axis=0) \
            if (np.asarray(snap.free) < m.p.n_type).any() else np.zeros(m.p.T, dtype=int)
        for t, k in enumerate(blocked):
            if k > 0:
                owner[start[t] + m.p.n_type[t] - int(k):start[t] + m.p.n_type[t]] = -2
        return Cand(owner, batch)

    def _emit(self, best: Cand, jobs: np.ndarray, running: set[int], cur: Cand) -> np.ndarray:
        m = self.m
        X = np.zeros((len(jobs), m.p.T), dtype=int)
        for r, i in enumerate(jobs):
            i = int(i)
            X[r] = m.counts(best, i)
            if X[r].sum():
                changed = i not in running or not np.array_equal(X[r], m.counts(cur, i)) \
                    or best.batch[i] != cur.batch.get(i)
                self.batch[i] = best.batch[i]
                if changed:  # the next update waits until it has run an epoch like this
                    self.mark[i] = self._rem_now[i]
        return X

    # -- operations -----------------------------------------------------
    def _refresh(self, c: Cand, cur: Cand, active: set[int], running: set[int],
                 frozen: set[int], jobs: np.ndarray, draws: np.ndarray) -> Cand:
        m = self.m
        c = c.copy()
        c.owner[[i not in active and i != -2 for i in c.owner.tolist()]] = -1  # (1) finished
        c.owner[c.owner == -2] = -1  # GPUs held outside this decision, as now
        c.owner[cur.owner == -2] = -2
        self._impose(c, cur, frozen)
        for i in c.jobs():  # (2) scale down jobs above their limit
            if i not in frozen and c.batch.get(i, 0) > self.limit.get(i, 1 << 30):
                c.batch[i] = self.limit[i]
        repair(m, c, self.limit, self.max_gpus, frozen)
        placed = set(c.jobs())
        for i in (int(j) for j in jobs):  # (3) new jobs get GPUs, from the largest batch
            if i in placed or i in self.batch:
                continue
            self._place_new(c, i, frozen)
        return self._fill(reorder(m, repair(m, c, self.limit, self.max_gpus, frozen)), jobs,
                          draws, frozen)

    def _min_set(self, i: int, free: np.ndarray) -> np.ndarray:
        """Fewest free GPUs on which job i can run some allowed batch: fastest types first,
        else largest memory first (fast GPUs with little memory may never hold the batch)."""
        m, p = self.m, self.m.p
        cap_k = min(int(p.hi[i]), self.max_gpus.get(i, int(p.hi[i])))
        for order in (fastest_types(p, i), largest_memory_types(p, i)):
            n = np.zeros(p.T, dtype=int)
            for t in order:
                while p.allowed[i, t] and n[t] < free[t] and n.sum() < cap_k:
                    n[t] += 1
                    if n.sum() >= p.lo[i]:
                        lo, hi = m.feasible_batches(i, n, self.limit.get(i))
                        if lo <= hi:
                            return n
        return np.zeros(p.T, dtype=int)

    @staticmethod
    def _impose(c: Cand, cur: Cand, frozen: set[int]) -> Cand:
        """Not an update: the running (frozen) jobs keep exactly their current GPUs and batch."""
        if frozen:
            c.owner[np.isin(c.owner, list(frozen))] = -1
            keep = np.isin(cur.owner, list(frozen))
            c.owner[keep] = cur.owner[keep]
            for i in frozen:
                c.batch[i] = cur.batch[i]
        return c

    def _place_new(self, c: Cand, i: int, frozen: set[int]) -> None:
        m, p = self.m, self.m.p
        for _ in range(m.K):
            free = np.bincount(m.slot_type[c.owner == -1], minlength=p.T)
            n = self._min_set(i, free)
            if n.sum():
                for t, k in enumerate(n):
                    slots = np.nonzero((c.owner == -1) & (m.slot_type == t))[0][:int(k)]
                    c.owner[slots] = i
                lo, hi = m.feasible_batches(i, n, self.limit.get(i))
                c.batch[i] = hi if lo <= hi else lo
                return
            donors = [j for j in c.jobs() if j not in frozen and (c.owner == j).sum() > 1]
            if not donors:
                return
            d = max(donors, key=lambda j: (c.batch.get(j, 0), j))
            c.owner[np.nonzero(c.owner == d)[0][-1]] = -1
            repair(m, c, self.limit, self.max_gpus, frozen)

    def _fill(self, c: Cand, jobs: np.ndarray, draws: np.ndarray, frozen: set[int]) -> Cand:
        """Idle GPUs go to jobs sampled by utilization gain (resume a waiting job or grow one)."""
        m, p = self.m, self.m.p
        mean_w = draws.mean(axis=0)
        row = {int(i): r for r, i in enumerate(jobs)}
        for _ in range(m.K):
            idle = np.nonzero(c.owner == -1)[0]
            if not len(idle):
                break
            opts: list[tuple[int, np.ndarray, int, float]] = []
            free = np.bincount(m.slot_type[idle], minlength=p.T)
            for i in row:
                if i in frozen:
                    continue
                n = m.counts(c, i)
                w = float(mean_w[row[i]])
                if n.sum() == 0:
                    add = self._min_set(i, free)
                    if not add.sum():
                        continue
                    lo, hi = m.feasible_batches(i, add, self.limit.get(i))
                    if lo <= hi:  # resuming a waiting job gains most; short ones first
                        opts.append((i, add, hi, 1e6 / (1.0 + w * m.per_work(i, add, hi))))
                    continue
                for t in np.nonzero(free)[0]:
                    n2 = n.copy()
                    n2[t] += 1
                    if n2.sum() > self.max_gpus.get(i, 1 << 30):
                        continue
                    lo, hi = m.feasible_batches(i, n2, self.limit.get(i))
                    if lo > hi:
                        continue
                    B = min(hi, max(lo, 2 * c.batch[i]))  # scale up: double with more GPUs
                    t0, t1 = w * m.per_work(i, n, c.batch[i]), w * m.per_work(i, n2, B)
                    # a running job grown off its current GPUs restarts: its lost progress
                    rc = self._rc if self._curkey.get(i, ((),))[0] == tuple(n.tolist()) else 0.0
                    if self.grow_faster and t1 + rc >= t0:
                        continue  # a scale-up that would not finish the job sooner
                    before, after = n.sum() * t0, n2.sum() * (t1 + rc)
                    opts.append((i, n2 - n, B, max(before - after, 0.0) + 1e-9))
            if not opts:
                break
            wts = np.array([o[3] for o in opts])
            i, add, B, _ = opts[int(self.rng.choice(len(opts), p=wts / wts.sum()))]
            for ty, k in enumerate(add.tolist()):
                slots = np.nonzero((c.owner == -1) & (m.slot_type == ty))[0][:k]
                c.owner[slots] = i
            c.batch[i] = int(B)
        return c
