"""The one evaluator: turns a policy's per-event decisions into a timed Plan.

Reset events are job arrivals and completions. At each one the policy is
asked for GPU counts per type per job; the evaluator places them on concrete
GPUs (packing onto few nodes), computes each job's integer batch shares and
iteration time from the model, charges the restart cost when a running job's
worker set changes, and advances time to the next event. Every policy goes
through this same code, so their objectives are comparable.

Dynamic mode (default) weighs three candidates at each event: "keep" (running
jobs stay put, free GPUs go to waiting jobs), the policy's "fresh" allocation
of all GPUs, and "wait" (running jobs stay, waiting jobs are deferred to the
next event). Another candidate replaces keep only if its predicted weighted
completion time, restart costs included, is lower; so a running job is moved
only when that pays off. ``static`` (and non-preemptive policies) always keep.

Elastic batches (docs/elastic.md): a policy with ``decides_batch`` (``ones``)
also chooses each job's global batch; it is applied as decided at every
event (and every ``tick_s``), a batch change on the same GPUs costs an
in-place rescale (``RESCALE_IN_PLACE_S``) instead of a restart, and
``remaining`` stays in iterations at the spec's batch B0: an iteration at
batch B does ``B * E(B) / B0`` of them, where E is the statistical
efficiency (Pollux, :func:`hetsched.core.efficiency.efficiency`; 1 without
the efficiency model or a known noise scale).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hetsched.core.efficiency import efficiency
from hetsched.core.model import balanced_shares, comm_time, equal_shares, step_time
from hetsched.core.plan import JobPlan, Plan, Segment, Worker
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import BaseReporter
from hetsched.errors import PlanningError
from hetsched.planning.bounds import problem_bound
from hetsched.planning.space.policies.base import Policy, Snapshot

EPS = 1e-9
#: active jobs x GPUs up to which idle GPUs trigger a fresh reallocation at every event
REPLAN_EVERY_EVENT_MAX = 20_000
#: seconds an in-place batch rescale costs a job (ONES reports about 1 s; measured: bench_ones)
RESCALE_IN_PLACE_S = 1.0


@dataclass
class Timing:
    batches: list[int]
    compute_s: float
    comm_s: float
    #: iterations at the spec's batch one iteration here is worth (1 at the spec's batch)
    work: float = 1.0

    @property
    def iteration_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def per_work_s(self) -> float:
        """Seconds per iteration of remaining work (which is counted at the spec's batch)."""
        return self.iteration_s / self.work


class Evaluator:
    """Exact per-placement timing (integer shares, real node layout), cached."""

    def __init__(self, problem: PlanningProblem, stat_efficiency: bool = True) -> None:
        self.p = problem
        self.stat_efficiency = stat_efficiency
        gpus = problem.cluster.gpus
        tindex = {t: k for k, t in enumerate(problem.types)}
        self.gpu_type = np.array([tindex[g.gpu_type] for g in gpus], dtype=int)
        self.gpu_type_list = self.gpu_type.tolist()
        nodes = sorted({g.node for g in gpus}, key=[g.node for g in gpus].index)
        nindex = {n: k for k, n in enumerate(nodes)}
        self.gpu_node = np.array([nindex[g.node] for g in gpus], dtype=int)
        self.nodes = nodes
        self._cache: dict[tuple[int, tuple[int, ...], bool, str, int], Timing] = {}

    def timing(self, i: int, gpu_ids: list[int], shares: str, batch: int | None = None
               ) -> Timing:
        p = self.p
        types = tuple(sorted(int(self.gpu_type[g]) for g in gpu_ids))
        single = len({int(self.gpu_node[g]) for g in gpu_ids}) == 1
        B0 = int(p.B[i])
        B = B0 if batch is None else int(batch)
        key = (i, types, single, shares, B)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        a = [float(p.a[i, t]) for t in types]
        c = [float(p.c[i, t]) for t in types]
        caps = [int(p.cap[i, t]) for t in types]
        b = balanced_shares(a, c, caps, B) if shares == "balanced" else equal_shares(caps, B)
        sync = max(float(p.sync[i, t]) for t in types)
        comm = comm_time(len(types), float(p.model_mb[i]), p.bandwidth(single), sync)
        el = p.jobs[i].elastic
        eff = efficiency(B, B0, el.noise_scale) if el is not None and self.stat_efficiency \
            else 1.0
        tm = Timing(b, step_time(a, c, b), comm, work=B * eff / B0)
        self._cache[key] = tm
        return tm

    def workers(self, i: int, gpu_ids: list[int], shares: str, batch: int | None = None
                ) -> tuple[list[Worker], Timing]:
        """Workers in type order matching the cached batch vector."""
        tm = self.timing(i, gpu_ids, shares, batch)
        order = sorted(gpu_ids, key=lambda g: (int(self.gpu_type[g]), g))
        gpus = self.p.cluster.gpus
        ws = [Worker(gpus[g].node, gpus[g].gpu_type, gpus[g].index, b)
              for g, b in zip(order, tm.batches, strict=True)]
        return ws, tm


class Placer:
    """Maps per-type counts to concrete GPUs."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev

    def place(self, counts: dict[int, np.ndarray], free: np.ndarray,
              current: dict[int, list[int]], oblivious: bool = False) -> dict[int, list[int]]:
        ev = self.ev
        free = free.copy()
        out: dict[int, list[int]] = {}
        pending: list[int] = []
        # 1. jobs whose counts are unchanged keep exactly their GPUs
        for i, n in counts.items():
            cur = current.get(i, [])
            if cur and all(free[g] for g in cur) and self._same_counts(cur, n):
                out[i] = list(cur)
                free[cur] = False
            elif n.sum() > 0:
                pending.append(i)
        pending.sort(key=lambda i: -int(counts[i].sum()))
        for i in pending:
            chosen: list[int] = []
            cur = current.get(i, [])
            for t, need in enumerate(counts[i]):
                need = int(need)
                if need == 0:
                    continue
                # 2. reuse this job's own GPUs of the type (no data to move there)
                mine = [g for g in cur if free[g] and ev.gpu_type[g] == t][:need]
                for g in mine:
                    free[g] = False
                chosen += mine
                need -= len(mine)
                if need:
                    got = self._take(t, need, free, oblivious,
                                     prefer_nodes={int(ev.gpu_node[g]) for g in chosen})
                    chosen += got
            out[i] = sorted(chosen)
        return out

    def _same_counts(self, gpu_ids: list[int], n: np.ndarray) -> bool:
        """Do these GPUs have exactly the per-type counts n? (Cheap: no array ops.)"""
        if len(gpu_ids) != int(n.sum()):
            return False
        types = self.ev.gpu_type_list
        need = n.tolist()
        for g in gpu_ids:
            t = types[g]
            need[t] -= 1
            if need[t] < 0:
                return False
        return True

    def _take(self, t: int, need: int, free: np.ndarray, oblivious: bool,
              prefer_nodes: set[int]) -> list[int]:
        ev = self.ev
        cand = np.nonzero(free & (ev.gpu_type == t))[0]
        if len(cand) < need:
            raise AssertionError("policy allocated more GPUs than are free")
        if oblivious:
            got = [int(g) for g in cand[:need]]
        else:
            by_node: dict[int, list[int]] = {}
            for g in cand:
                by_node.setdefault(int(ev.gpu_node[g]), []).append(int(g))
            # best fit: the node already used, else the smallest node that fits
            # the whole need, else fill from the fullest nodes down
            fits = [n for n, gs in by_node.items() if len(gs) >= need]
            pref = [n for n in fits if n in prefer_nodes]
            if pref:
                order = pref[:1]
            elif fits:
                order = [min(fits, key=lambda n: (len(by_node[n]), n))]
            else:
                order = sorted(by_node, key=lambda n: (-len(by_node[n]), n))
            got = []
            for n in order:
                take = by_node[n][: need - len(got)]
                got += take
                if len(got) == need:
                    break
        free[got] = False
        return got


def _validate(problem: PlanningProblem, policy: Policy, snap: Snapshot, X: np.ndarray) -> None:
    if X.shape != (len(snap.jobs), problem.T):
        raise AssertionError(f"{policy.name}: allocation has shape {X.shape}")
    if (X < 0).any() or (X.sum(axis=0) > snap.free).any():
        raise AssertionError(f"{policy.name}: allocation exceeds the free GPUs")
    J = snap.jobs
    k = X.sum(axis=1)
    bad = (k > 0) & ((k < problem.lo[J]) | (k > problem.hi[J])
                     | ((X > 0) & ~problem.allowed[J]).any(axis=1))
    if bad.any():
        r = int(np.argmax(bad))
        i = int(J[r])
        raise AssertionError(f"{policy.name}: job {problem.jobs[i].name} got {X[r]} "
                             f"outside its bounds [{problem.lo[i]}, {problem.hi[i]}]")


def simulate(problem: PlanningProblem, policy: Policy, *, static: bool = False,
             restart_cost_s: float = 60.0, reporter: BaseReporter | None = None,
             stat_efficiency: bool = True) -> Plan:
    """Run ``policy`` over the timeline of reset events and return the evaluated Plan.

    ``stat_efficiency=False`` counts an elastic job's progress in plain samples
    (ONES's assumption) instead of efficient samples (module docstring).
    """
    started_clock = time.perf_counter()
    p = problem
    S = p.S
    ev = Evaluator(p, stat_efficiency)
    placer = Placer(ev)
    K = len(p.cluster.gpus)
    owner = np.full(K, -1, dtype=int)
    alloc: dict[int, list[int]] = {}
    remaining = p.iters.astype(float).copy()
    ready_at = np.zeros(S)
    has_run = np.zeros(S, dtype=bool)
    done = np.zeros(S, dtype=bool)
    plans = [JobPlan(j.name, j.weight, j.arrival_s, spec=j) for j in p.jobs]
    open_seg: dict[int, Segment] = {}
    timing: dict[int, Timing] = {}
    oblivious = policy.placement == "oblivious"
    keep_only = static or not policy.preemptive
    # elastic batches: the policy's choice per job (decides_batch policies), the current one
    decides = bool(getattr(policy, "decides_batch", False))
    tick_s = getattr(policy, "tick_s", None) if decides else None
    batch = p.B.astype(int).copy()
    want: dict[int, int] = {}

    order = np.argsort(p.arrival, kind="stable")
    next_arr = 0
    last_fresh, idle_at_last = -np.inf, 0
    t = float(p.arrival[order[0]])

    def counts_of(gs: list[int]) -> np.ndarray:
        return np.bincount(ev.gpu_type[gs], minlength=p.T) if gs else np.zeros(p.T, dtype=int)

    def ask(jobs: list[int], free_mask: np.ndarray, cur: dict[int, list[int]]
            ) -> dict[int, list[int]]:
        if not jobs or not free_mask.any():
            return {}
        ja = np.array(jobs, dtype=int)
        snap = Snapshot(
            t=t, jobs=ja, remaining=remaining[ja].copy(),
            free=np.bincount(ev.gpu_type[free_mask], minlength=p.T),
            current=np.array([counts_of(cur.get(i, [])) for i in jobs]).reshape(len(jobs), p.T),
            waited=t - p.arrival[ja],
        )
        X = np.asarray(policy.allocate(p, snap), dtype=int)
        _validate(p, policy, snap, X)
        if decides:
            want.update(_validate_batches(p, policy, snap, X))
        counts = {int(i): X[r] for r, i in enumerate(jobs)}
        return placer.place(counts, free_mask, cur, oblivious)

    def predicted(i: int, gs: list[int], moved: bool) -> float:
        tm = ev.timing(i, gs, policy.shares)
        start = t + (restart_cost_s if moved and has_run[i] else 0.0)
        if not moved:
            start = max(t, ready_at[i])
        return start + remaining[i] * tm.per_work_s

    def score(cand: dict[int, list[int]], ref: dict[int, list[int]], jobs: list[int]) -> float:
        # Only the jobs whose GPUs differ between the candidates (``jobs``) are
        # scored; the others contribute equally to both, except through
        # ``first_free``, for which their current predicted end is enough.
        # Allocation lists are kept sorted, so they compare directly.
        ends = {}
        for i, gs in cand.items():
            if not gs:
                continue
            cur = alloc.get(i)
            if gs == cur:
                ends[i] = max(t, ready_at[i]) + remaining[i] * timing[i].per_work_s
            else:
                ends[i] = predicted(i, gs, True)
        first_free = min(ends.values(), default=t)
        total = 0.0
        for i in jobs:
            if i in ends:
                total += p.weight[i] * ends[i]
            else:
                # It waits at least until some GPUs free up, then runs as the
                # reference (fresh, else keep) would run it: a job is not
                # judged slower merely for waiting (assuming it then gets only
                # its minimal set made every fresh plan look better than
                # keeping); on its minimal set if no candidate runs it now.
                gs_other = ref.get(i)
                if gs_other:
                    best = ev.timing(i, gs_other, policy.shares).iteration_s
                else:
                    best = p.iter_time(i, _best_counts(p, i))[0]
                # A job that has run pays the restart cost when it gets GPUs
                # again; leaving it out made preempting a running job look
                # free, so fresh plans preempted jobs whatever the cost.
                rc = restart_cost_s if has_run[i] else 0.0
                total += p.weight[i] * (first_free + rc + remaining[i] * best)
        return total

    while not done.all():
        while next_arr < S and p.arrival[order[next_arr]] <= t + EPS:
            next_arr += 1
        active = [int(i) for i in order[:next_arr] if not done[i]]
        if reporter is not None:
            reporter.event(policy.name, t, len(active), int(done.sum()), S)
        if active:
            running = [i for i in active if alloc.get(i)]
            waiting = [i for i in active if not alloc.get(i)]
            free_mask = owner < 0
            keep = dict(alloc)
            if not decides or keep_only:
                keep.update(ask(waiting, free_mask, {}))
            new = keep
            # A fresh reallocation can only pay off if keeping would leave GPUs
            # idle or jobs waiting; otherwise every move just costs a restart.
            kept_gpus = sum(len(g) for g in keep.values())
            idle = kept_gpus < K
            queued = any(not keep.get(i) for i in active)
            # Idle GPUs alone (nobody waiting) trigger a fresh reallocation at
            # every event on small problems: the remaining work changes, so a
            # reallocation rejected at one event can pay at the next. Past
            # REPLAN_EVERY_EVENT_MAX (active jobs x GPUs) a fresh plan costs
            # more than it is likely to bring at each of a thousand
            # completions (it was most of the planning time for 1,000 jobs),
            # so it waits until the GPUs freed since the last one are 2% of
            # the cluster or a restart cost of simulated time has passed:
            # growing a running job costs it a restart anyway.
            idle_gpus = K - kept_gpus
            fresh_asked = False
            idle_due = idle and (len(active) * K <= REPLAN_EVERY_EVENT_MAX
                                 or idle_gpus - idle_at_last >= max(1, int(np.ceil(0.02 * K)))
                                 or t >= last_fresh + restart_cost_s - EPS)
            if decides and not keep_only:
                # the policy chose GPUs and batches for every active job (ONES
                # does its own selection and update rule): apply them as decided
                new = ask(active, np.ones(K, dtype=bool), alloc)
            elif not keep_only and running and (queued or idle_due):
                last_fresh, fresh_asked = t, True
                fresh = ask(active, np.ones(K, dtype=bool), alloc)
                # Three candidates: keep, fresh, and "wait": running jobs stay
                # and the waiting ones are deferred to the next event. Waiting
                # a little for fast GPUs that are about to free up can beat
                # both starting now on slow ones and moving a job that is
                # about to finish (it would pay a whole restart).
                wait = dict(alloc)
                cands = [keep, fresh] + ([wait] if wait != keep else [])
                diff = [i for i in active
                        if any(c.get(i, []) != keep.get(i, []) for c in cands[1:])]
                if diff:
                    ref_alloc = {i: fresh.get(i) or keep.get(i) or [] for i in diff}
                    scores = [score(c, ref_alloc, diff) for c in cands]
                    best = int(np.argmin(scores))
                    if scores[best] < scores[0] - 1e-6:
                        new = cands[best]
            # apply the decision: release every changed job's GPUs first, so a
            # job that leaves a GPU never clears the ownership of the job that
            # takes it over in the same event
            changed = [i for i in active if alloc.get(i, []) != new.get(i, [])
                       or (new.get(i) and want.get(i, batch[i]) != batch[i])]
            rescaled = {i for i in changed if alloc.get(i) and alloc.get(i) == new.get(i)}
            for i in changed:
                if i in open_seg:
                    seg = open_seg.pop(i)
                    seg.end_s = t
                    plans[i].segments.append(seg)
                    owner[alloc[i]] = -1
                alloc.pop(i, None)
            for i in changed:
                nw = sorted(new.get(i, []))
                if not nw:
                    continue
                if (owner[nw] >= 0).any():
                    raise AssertionError(f"{policy.name}: GPU given to two jobs at t={t}")
                batch[i] = want.get(i, batch[i])
                ws, tm = ev.workers(i, nw, policy.shares, int(batch[i]))
                rc = RESCALE_IN_PLACE_S if i in rescaled else \
                    restart_cost_s if has_run[i] else 0.0
                ready_at[i] = t + rc
                open_seg[i] = Segment(start_s=t, end_s=t, workers=ws,
                                      iteration_s=tm.iteration_s, compute_s=tm.compute_s,
                                      comm_s=tm.comm_s, restart_s=rc,
                                      global_batch=int(batch[i]) if p.jobs[i].elastic
                                      else None)
                timing[i] = tm
                alloc[i] = nw
                owner[nw] = i
                has_run[i] = True
            if fresh_asked:  # GPUs idle after this decision: the next trigger counts from here
                idle_at_last = int((owner < 0).sum())
        # advance to the next event
        fin = {i: max(t, ready_at[i]) + remaining[i] * timing[i].per_work_s for i in alloc}
        t_arr = float(p.arrival[order[next_arr]]) if next_arr < S else np.inf
        t_fin = min(fin.values(), default=np.inf)
        t_next = min(t_arr, t_fin)
        if tick_s and alloc and np.isfinite(t_next):  # periodic re-decisions (ONES epochs)
            t_next = min(t_next, t + float(tick_s))
        if not np.isfinite(t_next):
            stuck = [p.jobs[i].name for i in range(S) if not done[i]]
            raise PlanningError(f"policy {policy.name!r} cannot place job(s) "
                                f"{', '.join(stuck[:5])}: no GPUs were allocated and no event "
                                "is left that would free any")
        for i in list(alloc):
            tm = timing[i]
            ran = max(0.0, t_next - max(t, ready_at[i]))
            seg = open_seg[i]
            if fin[i] <= t_next + EPS * max(1.0, t_next):
                seg.iterations += remaining[i] / tm.work
                seg.end_s = fin[i]
                remaining[i] = 0.0
                done[i] = True
                plans[i].segments.append(open_seg.pop(i))
                owner[alloc.pop(i)] = -1
            else:
                seg.iterations += ran / tm.iteration_s
                remaining[i] -= ran / tm.per_work_s
        t = t_next

    ref = {j.name: float(p.iters[i] * p.equal_share_time(i)) for i, j in enumerate(p.jobs)}
    plan = Plan(
        policy=policy.name, jobs=plans, lower_bound_s=problem_bound(p),
        params=policy.get_params(), static=static, restart_cost_s=restart_cost_s,
        cluster={"name": p.cluster.name, "gpus": {t: int(n) for t, n in
                                                  zip(p.types, p.n_type, strict=True)}},
        fairness_ref=ref,
    )
    plan.planning_time_s = time.perf_counter() - started_clock
    return plan


def _validate_batches(p: PlanningProblem, policy: Policy, snap: Snapshot, X: np.ndarray
                      ) -> dict[int, int]:
    """A decides_batch policy's global batches: in the job's range, held by its GPUs."""
    out = {}
    for r, i in enumerate(snap.jobs):
        i = int(i)
        k = int(X[r].sum())
        if k == 0:
            continue
        B = int(policy.batch_for(i))  # type: ignore[attr-defined]
        el = p.jobs[i].elastic
        lo, hi = (el.min_batch, el.max_batch) if el is not None else (int(p.B[i]), int(p.B[i]))
        held = int((p.cap[i] * X[r]).sum())
        if not (lo <= B <= hi and k <= B <= held):
            raise AssertionError(f"{policy.name}: job {p.jobs[i].name} got global batch {B} "
                                 f"on {k} GPUs holding {held}; its range is [{lo}, {hi}]")
        out[i] = B
    return out


def _best_counts(p: PlanningProblem, i: int) -> np.ndarray:
    """The fewest of a job's fastest GPUs that hold its batch (for waiting-time estimates).

    min_gpus alone on the fastest type often cannot hold the global batch
    in memory: its iteration time was then inf, "keep" scored inf whenever
    such a job waited, and any fresh plan won, preempting running jobs
    whatever the restart cost.
    """
    from hetsched.planning.space.policies.common import fastest_types, min_feasible

    return min_feasible(p, i, p.n_type, fastest_types(p, i))
