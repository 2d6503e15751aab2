"""The plan's order in Slurm's terms: ``--dependency=afterany:<id>``.

A plan starts some jobs later, on GPUs an earlier job frees. Queued without
more, Slurm's backfill would start such a job as soon as *any* matching GPUs
are idle, so what runs would not be what was planned. Each job whose first
segment takes a GPU that another job's first segment held before it gets
``afterany`` on that job (the latest holder of each of its GPUs), so Slurm
starts it only once those jobs ended (completed, failed or cancelled: a
replan that moves the earlier job also releases the later one, and rewrites
its dependency, see replan.py).

Why dependencies and not the alternatives (docs/slurm.md, "Plan order"):

* ``--begin=<time>`` pins the plan's *estimated* times: a job that ends early
  leaves GPUs idle until the begin time, one that ends late lets the next job
  start on GPUs that are still busy (Slurm then runs it elsewhere or waits
  with the right GPUs taken by backfill);
* hold and release needs a daemon (or cron replan) to release each job at
  the right moment and adds a full poll interval of idle GPUs per step;
* submitting in waves has the same latency and hides the queue from users.

Dependencies need nothing running, start the next job within one scheduler
pass of the previous one ending, and show in ``squeue`` (reason
``Dependency``) why a job waits.

Why ``afterany`` and not ``afterok``: ``afterok`` is never satisfied when the
predecessor fails, so the next job would wait for ever (reason
``DependencyNeverSatisfied``), and on a site with ``kill_invalid_depend`` Slurm
cancels it, which reads as a user's cancel. With ``afterany`` a failure frees
the GPUs for the plan's next job on them, as a completion does, and the
replan that follows the failure restores the order: after every replan each
pending job waits for exactly what the new plan and the queue say
(:func:`waits_for`): its plan predecessors, and any job that runs *now* on a
GPU the plan gives it (the plan may not have expected that job there: a job
the failure let start early, or one that outlived its prediction). So no
pending job is left waiting on ``Resources`` behind a running job without a
dependency on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetsched.core.plan import Plan

EPS = 1e-6


def plan_order(plan: Plan, names: set[str] | None = None) -> list[str]:
    """Job names by the start of their first segment (then by name): the submit order."""
    jobs = [j for j in plan.jobs if j.segments and (names is None or j.name in names)]
    return [j.name for j in sorted(jobs, key=lambda j: (j.segments[0].start_s, j.name))]


def predecessors(plan: Plan) -> dict[str, list[str]]:
    """For each job, the jobs whose first segment last held one of its GPUs before it.

    Only first segments count: a job's later segments are submitted by replan,
    which recomputes the order for what is queued then.
    """
    holders: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for j in plan.jobs:
        if not j.segments:
            continue
        s = j.segments[0]
        for w in s.workers:
            holders.setdefault((w.node, w.gpu), []).append((s.start_s, s.end_s, j.name))
    out: dict[str, list[str]] = {}
    for j in plan.jobs:
        if not j.segments or not j.segments[0].workers:
            continue
        s = j.segments[0]
        before: set[str] = set()
        for w in s.workers:
            earlier = [(end, name) for start, end, name in holders[(w.node, w.gpu)]
                       if name != j.name and end <= s.start_s + EPS and start < s.start_s]
            if earlier:
                before.add(max(earlier)[1])
        if before:
            out[j.name] = sorted(before)
    return out


def dependency_expr(preds: list[str], ids: Mapping[str, str]) -> str:
    """``afterany:ID:ID`` for the predecessors that have a Slurm id ('' when none)."""
    known = sorted({ids[p] for p in preds if ids.get(p)}, key=lambda i: (len(i), i))
    return "afterany:" + ":".join(known) if known else ""


def waits_for(plan: Plan, running: Mapping[str, Sequence[Mapping[str, Any]]]
              ) -> dict[str, list[str]]:
    """What each job of ``plan`` must wait for now: its plan predecessors, plus the jobs
    that run now (``running``: job -> its workers, ``{"node", "gpu"}``) on a GPU its first
    segment takes. A running job never waits."""
    held: dict[tuple[str, int], set[str]] = {}
    for name, workers in running.items():
        for rw in workers:
            held.setdefault((str(rw.get("node")), int(rw.get("gpu", -1))), set()).add(name)
    plan_preds = predecessors(plan)
    out = {k: set(v) for k, v in plan_preds.items()}
    for j in plan.jobs:
        if not j.segments or j.name in running:
            continue
        for w in j.segments[0].workers:
            out.setdefault(j.name, set()).update(held.get((w.node, w.gpu), set()) - {j.name})
    # a predecessor that already runs no longer holds back what the plan put before it:
    # wait for those too (the plan's order among the pending jobs stays)
    for name, before in out.items():
        todo = [p for p in before if p in running]
        while todo:
            for q in plan_preds.get(todo.pop(), []):
                if q != name and q not in before:
                    before.add(q)
                    if q in running:
                        todo.append(q)
    return {k: sorted(v) for k, v in out.items() if v and k not in running}
