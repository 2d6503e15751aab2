"""``hetsched replan`` for a pool-mode plan: the rounds left, on the GPUs still up.

``app.replan.replan`` runs this pass when the active plan is a pool plan (app/modes.py). A
pool plan runs as one hetjob; when it fails (an executor died: the step ends
every executor, the job ends FAILED; a node died: NODE_FAIL) or cannot start
(it waits for a node that went down), this:

1. reads each job's checkpointed rounds (``completed_rounds``: the sidecars
   ``<checkpoint_dir>/<plan_id>/<job>.json`` the executors write at round
   boundaries) -- the rounds since a job's last checkpoint are lost and run again;
2. plans the remaining iterations of the unfinished jobs with the old plan's
   own settings (``PlanSettings``: mode, policy, parameters, task size) on the
   partition as Slurm reports it now (down and drained nodes left out);
3. keeps each job's round numbering: the new plan's rounds of a job start at
   its completed rounds, and its first one at the global step the job reached
   (the iterations of its completed rounds, which in an uneven plan differ from
   round to round: ``resume.iterations_done``), so its sampler goes on where it
   stopped; the job's checkpoint is copied into the new plan's checkpoint
   directory, where the executors resume from it;
4. submits the new plan as one hetjob (``app.pool_submit``), cancelling the
   old one if it was still queued.

A job that failed more than ``max_failures`` times is given up. The new plan is
made with the old task size (iterations per task) where the jobs left share one
(a plan made with ``--task-iterations``, or equal automatic sizes): a round of
equal slices then groups the same iterations into one optimizer step as before,
so a replanned equal plan trains exactly as an uninterrupted one. Jobs of
different sizes are planned with the old plan's own request (the work left may
get other automatic sizes). Where the new plan has equal rounds but a job's
steps reached are not its completed rounds times its new task size (the old
rounds were uneven, or of another size), the new plan's rows are written with
their own local batch and iterations (the same slices), so the executor counts
the steps from ``resume.iterations_done``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetsched.app.plan import how_planned
from hetsched.app.pool_submit import PoolDirs, pool_dirs, submit_pool
from hetsched.app.replan_changes import ended_now
from hetsched.app.replan_pass import (
    FAILED_STATES,
    ReplanResult,
    loaded,
    poll_reset_events,
    replanned_from,
)
from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import UNEVEN_COLUMNS, PoolTasks, TaskRow, TaskRun
from hetsched.core.spec import Job
from hetsched.io.files import private_dir
from hetsched.io.plan_json import plan_from_dict
from hetsched.io.pool_reports import completed_rounds, read_pool_reports
from hetsched.runtime.sampler import split_counts
from hetsched.slurm.client import SlurmClient
from hetsched.slurm.inventory import load_inventory
from hetsched.state.store import CANCELLED, SUPERSEDED, Store, Submission

NODE_KINDS = frozenset({"node-down", "node-drained", "job-blocked"})


def pool_replan(store: Store, client: SlurmClient, table: Any, *, policy: str | None = None,
                partition: str | None = None, spool: str | Path | None = None,
                force: bool = False, dry_run: bool = False, max_failures: int = 2,
                log: Callable[[str], None] = lambda _m: None) -> ReplanResult:
    """One replan pass for the active pool plan (see module doc). The caller holds the lock."""
    cycle, events, reason = poll_reset_events(store, client, partition, spool, log)
    if not events and not force:
        return ReplanResult("unchanged", "no reset events")
    raw = store.active_plan()
    assert raw is not None and raw.get("mode") == "pool"
    old = plan_from_dict(raw, f"stored plan {raw.get('plan_id')}")
    pid = str(raw["plan_id"])
    rows = [s for s in store.submissions(pid) if s.state != SUPERSEDED]
    # new jobs are not added to a pool (a running one would restart): said, left in place,
    # taken by the first pass after the pool has ended (app/modes.replan_mode)
    untaken = [str(e["detail"]) for e in events if e["kind"] == "spool-new" and e["detail"]]
    for f in untaken:
        log(f"spool {f}: not taken: the active plan {pid} is a pool plan")

    def unchanged(why: str, **kw: Any) -> ReplanResult:
        if not dry_run:
            store.mark_handled([e["id"] for e in events])
        return ReplanResult("unchanged", f"{reason}; {why}", spool_untaken=untaken, **kw)

    dropped = {e["job"] for e in events if e["kind"] == "job-cancelled"} & {
        s.job for s in rows if s.state == CANCELLED}
    why = _leave_alone([s for s in rows if s.state != CANCELLED], pid, force or bool(dropped),
                       any(e["kind"] in NODE_KINDS for e in events))
    if why:
        return unchanged(why)
    dirs = pool_dirs(store, pid)
    result = ReplanResult("replanned", reason, spool_untaken=untaken)
    jobs, offsets, steps = _jobs_left(store, old, dirs, max_failures, result, log)
    if not jobs:
        return unchanged("no work left", done=result.done, given_up=result.given_up)
    new_plan = _new_plan(old, jobs, offsets, load_inventory(client, partition).cluster,
                         table, policy, steps)
    new = new_plan.to_dict()
    result.new_plan_id, result.plan = str(new["plan_id"]), new
    cancel = [s for s in rows if s.slurm_id and s.state not in FAILED_STATES
              and s.state not in ("COMPLETED", CANCELLED)]  # a user's cancel stays on record
    if dry_run:
        result.status = "dry-run"
        result.submitted = [(j.name, "(dry-run)") for j in jobs]
        result.cancelled = [(s.job, s.slurm_id or "?") for s in cancel]
        return result
    # the pool's Slurm job, live when this pass read the batch, ended since: replacing it
    # would undo a user's scancel or run finished work again. Its events stay unhandled:
    # the next pass sees its end, recorded by the monitor
    ended = ", ".join(sorted(ended_now(client, {s.slurm_id for s in cancel if s.slurm_id})))
    if ended:  # a user's scancel, or the pool's end, while this pass planned: it stands
        return ReplanResult("unchanged", f"{reason}; pool job {ended} ended while this "
                            "replan planned: left as it is, for the monitor to record",
                            spool_untaken=untaken)
    rid = store.begin_replan(reason, pid)
    try:
        carry_checkpoints(dirs.checkpoint_dir, pid, result.new_plan_id,
                          [n for n, k in offsets.items() if k > 0])
        res = submit_pool(new_plan, store, client, partition=partition, source="replan",
                          allow_active_elsewhere=True)
        result.submitted = res.submitted + res.skipped
        client.cancel(sorted({s.slurm_id for s in cancel if s.slurm_id}))
        with store.tx():
            for s in cancel:
                store.set_state(s.id, SUPERSEDED)
        result.cancelled = [(s.job, s.slurm_id or "") for s in cancel]
    except BaseException as e:
        store.finish_replan(rid, f"failed: {e}"[:500], result.new_plan_id)
        raise
    store.finish_replan(rid, "ok", result.new_plan_id, [i for _, i in result.cancelled],
                        sorted({i for _, i in result.submitted}))
    store.mark_handled([e["id"] for e in events])
    log(f"pool replan {pid} -> {result.new_plan_id}: resume {json.dumps(offsets)}")
    return result


def _leave_alone(rows: list[Submission], pid: str, force: bool, node_event: bool
                 ) -> str | None:
    """Why the pool job needs no replan (None: replan it)."""
    state = rows[0].state if rows else "NONE"
    sid = rows[0].slurm_id if rows else "-"
    if state == "COMPLETED":
        return f"pool plan {pid} completed"
    if force or state in FAILED_STATES or (state == "PENDING" and node_event):
        return None
    return f"pool job {sid} is {state}"


def _jobs_left(store: Store, old: Plan, dirs: PoolDirs, max_failures: int,
               result: ReplanResult, log: Callable[[str], None]
               ) -> tuple[list[Job], dict[str, int], dict[str, int]]:
    """The unfinished jobs with only their remaining iterations, their completed rounds and
    the global steps those rounds ran (where each one's sampler goes on)."""
    meta = old.tasks.jobs if old.tasks is not None else {}
    own = round_iterations(old.tasks) if old.tasks is not None else {}
    done = completed_rounds(old, dirs.checkpoint_dir)
    pid = old.plan_id or ""
    finished = {n for n, jp in read_pool_reports(dirs.report_dir, pid).jobs.items() if jp.done}
    chain = replanned_from(store, pid)  # failures count in this pool's plans only
    jobs: list[Job] = []
    for jp in old.jobs:
        m, k = meta.get(jp.name), done.get(jp.name, 0)
        if jp.name in finished or m is None or k >= m.rounds:
            result.done.append(jp.name)
        elif any(s.state == CANCELLED for s in store.submissions(pid, jp.name)):
            result.user_cancelled.append(jp.name)  # dropped by `hetsched cancel`: final
        elif sum(1 for s in store.submissions(job=jp.name)
                 if s.state in FAILED_STATES and s.plan_id in chain) > max_failures:
            result.given_up.append(jp.name)
        elif jp.spec is None:
            log(f"job {jp.name}: no spec in plan {pid}; left out")
        else:
            jobs.append(_remaining(jp.spec, iterations_left(old, own, jp.name, k)))
    offsets = {j.name: done.get(j.name, 0) for j in jobs}
    return jobs, offsets, {n: steps_before(old, own, n, k) for n, k in offsets.items()}


def _new_plan(old: Plan, jobs: list[Job], offsets: dict[str, int], cluster: Any, table: Any,
              policy: str | None, steps: dict[str, int]) -> Plan:
    """Plan the remaining work the old plan's way, its rounds numbered as before."""
    from hetsched.app.plan import PlanInputs, plan_jobs

    settings = how_planned(old, policy)
    meta = old.tasks.jobs if old.tasks is not None else {}
    sizes = {meta[j.name].iterations_per_task for j in jobs if j.name in meta}
    asked = dataclasses.replace(settings, task_iterations=sizes.pop()) if len(sizes) == 1 \
        else settings  # one size: the old one, so equal rounds group their steps as before
    new_plan = plan_jobs(PlanInputs(jobs, cluster, loaded(table), None, "replan"), asked)
    new_plan.settings = settings  # the request, as the old plan made it
    tasks = new_plan.tasks
    if tasks is not None and not round_iterations(tasks) and any(
            steps[n] != k * tasks.jobs[n].iterations_per_task for n, k in offsets.items()):
        as_uneven(tasks, {j.name: j for j in jobs})  # rounds x size is not the step reached
    renumber(new_plan, offsets)
    new_plan.notes.replan_of = old.plan_id
    new_plan.notes.replanned_at = round(time.time(), 3)
    new_plan.notes.resume = {n: {"plan_id": old.plan_id, "rounds_done": k,
                                 "iterations_done": steps[n]} for n, k in offsets.items()}
    new_plan.plan_id = None
    new_plan.plan_id = str(new_plan.to_dict()["plan_id"])
    return new_plan


def round_iterations(tasks: PoolTasks) -> dict[str, dict[int, int]]:
    """Per job, its rounds' own iterations where the rows carry them (uneven tasks; one
    pass over the plan's rows); jobs of equal rounds are left out."""
    out: dict[str, dict[int, int]] = {}
    for g in tasks.gpus:
        for r in g.rows():
            if r.iterations is not None:
                out.setdefault(r.job, {})[r.round] = r.iterations
    return out


def steps_before(plan: Plan, own: dict[str, dict[int, int]], job: str, rounds: int) -> int:
    """The global steps ``job`` ran before its round ``rounds`` of ``plan`` (where its
    sampler goes on), counted as the executor counts them: equal rounds
    ``rounds * iterations_per_task``; uneven ones their own iterations, after the steps
    before the plan's first round of the job (a replanned plan's ``resume``
    ``iterations_done``, else ``iterations_per_task`` per round)."""
    assert plan.tasks is not None
    m, mine = plan.tasks.jobs[job], own.get(job)
    if not mine:
        return rounds * m.iterations_per_task
    first = min(mine)
    done = ((plan.notes.resume or {}).get(job) or {}).get("iterations_done")
    before = first * m.iterations_per_task if done is None else int(done) if first else 0
    return before + sum(mine.get(r, 0) for r in range(first, rounds))


def iterations_left(plan: Plan, own: dict[str, dict[int, int]], job: str, rounds: int) -> int:
    """The iterations of ``job``'s rounds from ``rounds`` on in ``plan`` (exact, uneven
    rounds included)."""
    assert plan.tasks is not None
    m, mine = plan.tasks.jobs[job], own.get(job)
    if not mine:
        return m.iterations - rounds * m.iterations_per_task
    return sum(n for r, n in mine.items() if r >= rounds)


def _remaining(spec: Job, left: int) -> Job:
    """The job with only ``left`` iterations, arriving now."""
    return dataclasses.replace(spec, arrival_s=0.0, epochs=left / spec.steps_per_epoch)


def as_uneven(tasks: PoolTasks, specs: dict[str, Job]) -> None:
    """Write an equal-round plan's rows with their own local batch (the equal slice they
    train: ``split_counts(B, [b]*P)``) and iterations (in place): the same plan, whose
    rounds the executor then counts from ``resume.iterations_done``. A run whose repeats
    would need two iteration counts (it holds a job's shorter last round) is expanded."""
    meta = tasks.jobs
    slices = {n: split_counts(specs[n].global_batch, [m.local_batch] * m.tasks_per_round)
              for n, m in meta.items() if n in specs}

    def row(r: TaskRow) -> TaskRow:
        m = meta[r.job]
        n = m.last_round_iterations if r.round == m.rounds - 1 else m.iterations_per_task
        return r._replace(local_batch=slices[r.job][r.task], iterations=n)

    def runs(run: TaskRun) -> tuple[TaskRun, ...]:
        rows = list(run.expand())
        pattern = [row(r).iterations for r in run.rows]
        if any(row(r).iterations != pattern[i % len(pattern)] for i, r in enumerate(rows)):
            return tuple(TaskRun((row(r),)) for r in rows)
        return (dataclasses.replace(run, rows=tuple(row(r) for r in run.rows)),)

    tasks.gpus = [dataclasses.replace(g, runs=tuple(x for run in g.runs for x in runs(run)))
                  for g in tasks.gpus]
    tasks.columns = UNEVEN_COLUMNS
    if tasks.stored_rows is not None:
        tasks.stored_rows = sum(g.stored_rows() for g in tasks.gpus)


def renumber(plan: Plan, offsets: dict[str, int]) -> None:
    """Shift each job's rounds in a pool plan by its completed rounds (in place).

    Round ``r`` of the new plan becomes ``r + offset`` and the job's round count
    grows by the offset: the checkpoint's ``rounds_done`` is the new plan's first
    round. The global step that round starts at is the plan's ``resume``
    ``iterations_done`` (rows with their own iterations), or ``offset x N`` where
    that is the step reached (equal rows, task size ``N``).
    """
    tasks = plan.tasks
    if tasks is None:
        return
    tasks.gpus = [dataclasses.replace(g, runs=tuple(
        dataclasses.replace(run, rows=tuple(
            row._replace(round=row.round + offsets.get(row.job, 0))
            for row in run.rows))
        for run in g.runs)) for g in tasks.gpus]
    tasks.jobs = {name: dataclasses.replace(m, rounds=m.rounds + offsets.get(name, 0))
                  for name, m in tasks.jobs.items()}


def carry_checkpoints(checkpoint_dir: Path, old_id: str, new_id: str, jobs: list[str]) -> None:
    """Copy the jobs' checkpoints (``.pt`` then the ``.json`` sidecar) to the new plan's dir."""
    src, dst = Path(checkpoint_dir) / old_id, Path(checkpoint_dir) / new_id
    private_dir(dst)
    for job in jobs:
        for suffix in (".pt", ".json"):  # the sidecar last: it never claims more than the .pt
            s = src / f"{job}{suffix}"
            if s.exists():
                tmp = dst / f".{job}{suffix}.tmp"
                shutil.copyfile(s, tmp)
                os.chmod(tmp, 0o600)  # the executors refuse a checkpoint others could write
                tmp.replace(dst / f"{job}{suffix}")
