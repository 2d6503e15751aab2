"""The timeline: what holds between reset events, and how time advances.

Reset events are job arrivals, completions and the times a policy asks to
be woken at. Between two events every running job's worker set is fixed; a
job whose worker set changes closes its segment and opens a new one, paying
the restart cost (``ready_at``) if it has run before. Iterations are
counted from when a segment is ready, so every segment satisfies
``iterations * iteration_s = max(0, end_s - start_s - restart_s)``
(docs/formats.md): a job moved again before its restart finished ran none.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetsched.core.plan import JobPlan, Segment
from hetsched.core.problem import PlanningProblem
from hetsched.errors import PlanningError
from hetsched.planning.space.groups import GroupTimer
from hetsched.planning.space.scorer import Evaluator, Timing

EPS = 1e-9
#: seconds an in-place batch rescale costs a job (ONES reports about 1 s; bench_ones measures ours)
RESCALE_IN_PLACE_S = 1.0


class Timeline:
    """Who holds which GPUs, the work left, and the segments written so far."""

    def __init__(self, p: PlanningProblem, ev: Evaluator, restart_cost_s: float) -> None:
        self.p, self.ev, self.restart_cost_s = p, ev, restart_cost_s
        S = p.S
        self.K = len(p.cluster.gpus)
        self.owner = np.full(self.K, -1, dtype=int)
        self.alloc: dict[int, list[int]] = {}
        self.remaining = p.iters.astype(float).copy()
        self.ready_at = np.zeros(S)
        self.has_run = np.zeros(S, dtype=bool)
        self.done = np.zeros(S, dtype=bool)
        self.plans = [JobPlan(j.name, j.weight, j.arrival_s, spec=j) for j in p.jobs]
        self.open_seg: dict[int, Segment] = {}
        #: co-located jobs: each member -> all members of its group (sorted), itself included
        self.mates: dict[int, tuple[int, ...]] = {}
        self.timing: dict[int, Timing] = {}
        #: each job's current global batch (elastic jobs may change it; docs/elastic.md)
        self.batch = p.B.astype(int).copy()
        #: jobs the timeline started where they already ran (replan, :meth:`seed`)
        self.seeded: set[int] = set()
        self.order = np.argsort(p.arrival, kind="stable")
        self.next_arr = 0
        self.t = float(p.arrival[self.order[0]])

    @property
    def finished(self) -> bool:
        return bool(self.done.all())

    def arrive(self) -> list[int]:
        """Admit the jobs that have arrived by now; the active (arrived, unfinished) jobs."""
        p = self.p
        while self.next_arr < p.S and p.arrival[self.order[self.next_arr]] <= self.t + EPS:
            self.next_arr += 1
        return [int(i) for i in self.order[: self.next_arr] if not self.done[i]]

    def seed(self, running: dict[int, list[int]], shares: str, who: str) -> None:
        """Start ``running`` (job -> GPU ids) where they run now (replan): they have run,
        so moving one costs the restart; keeping one costs nothing. A seeded segment
        closed before it ran (the first decision moved the job) is not recorded."""
        self.apply(running, sorted(running), shares, who)
        for i in running:
            self.has_run[i] = True
        self.seeded = set(running)

    def counts_of(self, gs: list[int]) -> np.ndarray:
        if not gs:
            return np.zeros(self.p.T, dtype=int)
        return np.bincount(self.ev.gpu_type[gs], minlength=self.p.T)

    def apply(self, new: dict[int, list[int]], active: list[int], shares: str,
              who: str, want: dict[int, int] | None = None,
              groups: dict[int, str | None] | None = None,
              timer: GroupTimer | None = None) -> None:
        """Give each active job its GPUs in ``new``: changed jobs close and open segments.

        Every changed job's GPUs are released first, so a job that leaves a GPU
        never clears the ownership of the job that takes it over in this event.
        ``want``: global batches a batch-deciding policy chose; a job whose batch
        changes on the same GPUs is rescaled in place (RESCALE_IN_PLACE_S).
        ``groups`` (co-locating policies, :mod:`.groups`): each job's group id;
        members share their GPUs and are timed together by ``timer``; a job
        whose group changes on the same GPUs opens a new segment at no cost.
        """
        t, alloc, owner = self.t, self.alloc, self.owner
        want = want or {}
        mates = _mates(active, new, groups) if groups is not None else {}
        changed = [i for i in active if alloc.get(i, []) != new.get(i, [])
                   or (new.get(i) and want.get(i, self.batch[i]) != self.batch[i])
                   or mates.get(i, ()) != self.mates.get(i, ())]
        same_gpus = {i for i in changed if alloc.get(i) and alloc.get(i) == new.get(i)}
        rescaled = {i for i in same_gpus if want.get(i, self.batch[i]) != self.batch[i]}
        for i in changed:
            if i in self.open_seg:
                seg = self.open_seg.pop(i)
                seg.end_s = t
                if not (i in self.seeded and seg.end_s <= seg.start_s + EPS):
                    self.plans[i].segments.append(seg)
                self._release(i)
            alloc.pop(i, None)
            self.mates.pop(i, None)
        timed = self._group_timings(changed, new, mates, shares, want, timer, who)
        for i in changed:
            nw = sorted(new.get(i, []))
            if not nw:
                continue
            holders = owner[nw]
            if ((holders >= 0) & ~np.isin(holders, mates.get(i, ()))).any():
                raise AssertionError(f"{who}: GPU given to two jobs at t={t}")
            self.batch[i] = want.get(i, self.batch[i])
            ws, tm = self.ev.workers(i, nw, shares, int(self.batch[i]))
            tm = timed.get(i, tm)
            rc = RESCALE_IN_PLACE_S if i in rescaled else 0.0 if i in same_gpus else \
                self.restart_cost_s if self.has_run[i] else 0.0
            self.ready_at[i] = t + rc
            self.open_seg[i] = Segment(start_s=t, end_s=t, workers=ws,
                                       iteration_s=tm.iteration_s, compute_s=tm.compute_s,
                                       comm_s=tm.comm_s, restart_s=rc,
                                       global_batch=int(self.batch[i])
                                       if self.p.jobs[i].elastic else None,
                                       group=groups.get(i) if groups and len(mates.get(i, ())) > 1
                                       else None)
            self.timing[i] = tm
            alloc[i] = nw
            owner[nw] = i
            if i in mates:
                self.mates[i] = mates[i]
            self.has_run[i] = True

    def _group_timings(self, changed: list[int], new: dict[int, list[int]],
                       mates: dict[int, tuple[int, ...]], shares: str, want: dict[int, int],
                       timer: GroupTimer | None, who: str) -> dict[int, Timing]:
        """Timings of the changed jobs that share GPUs, group by group (memory checked)."""
        out: dict[int, Timing] = {}
        if timer is None:
            return out
        for i in changed:
            ms = list(mates.get(i, ()))
            if len(ms) < 2 or i in out or not new.get(i):
                continue
            gpus = sorted(new[i])
            batches = {j: int(want.get(j, self.batch[j])) for j in ms}
            tms = timer.timings(ms, gpus, shares, batches)
            timer.check_memory(ms, gpus, tms, who)
            out.update(zip(ms, tms, strict=True))
        return out

    def _release(self, i: int) -> None:
        """Job i leaves its GPUs; a co-located mate still on them becomes their holder."""
        gs = self.alloc.get(i, [])
        rest = [j for j in self.mates.get(i, ()) if j != i and self.alloc.get(j) == gs]
        self.owner[gs] = rest[0] if rest else -1

    def finish_times(self) -> dict[int, float]:
        t = self.t
        return {i: max(t, self.ready_at[i]) + self.remaining[i] * self.timing[i].per_work_s
                for i in self.alloc}

    def advance(self, wakeup: Callable[[float], float] | None, who: str) -> None:
        """Run every job until the next event and move time there."""
        p, t = self.p, self.t
        fin = self.finish_times()
        t_arr = float(p.arrival[self.order[self.next_arr]]) if self.next_arr < p.S else np.inf
        t_fin = min(fin.values(), default=np.inf)
        t_wake = wakeup(t) if wakeup is not None else np.inf
        t_next = min(t_arr, t_fin, t_wake if t_wake > t + EPS else np.inf)
        if not np.isfinite(t_next):
            stuck = [p.jobs[i].name for i in range(p.S) if not self.done[i]]
            raise PlanningError(f"policy {who!r} cannot place job(s) "
                                f"{', '.join(stuck[:5])}: no GPUs were allocated and no event "
                                "is left that would free any")
        for i in list(self.alloc):
            tm = self.timing[i]
            ran = max(0.0, t_next - max(t, self.ready_at[i]))
            seg = self.open_seg[i]
            if fin[i] <= t_next + EPS * max(1.0, t_next):
                seg.iterations += self.remaining[i] / tm.work
                seg.end_s = fin[i]
                self.remaining[i] = 0.0
                self.done[i] = True
                self.plans[i].segments.append(self.open_seg.pop(i))
                self._release(i)
                self.alloc.pop(i)
                self.mates.pop(i, None)
            else:
                seg.iterations += ran / tm.iteration_s
                self.remaining[i] -= ran / tm.per_work_s
        self.t = t_next


def _mates(active: list[int], new: dict[int, list[int]], groups: dict[int, str | None]
           ) -> dict[int, tuple[int, ...]]:
    """Each co-located job -> the members of its group that have GPUs (sorted); a group
    of one is a job alone and has no entry."""
    by: dict[str, list[int]] = {}
    for i in active:
        g = groups.get(i)
        if g is not None and new.get(i):
            by.setdefault(g, []).append(i)
    return {i: tuple(sorted(ms)) for ms in by.values() if len(ms) > 1 for i in ms}


__all__ = ["Timeline", "EPS"]
