"""Space mode's replan pass: bring Slurm in line with a fresh plan after reset events.

(``hetsched replan`` itself, the lock and the log: app/replan.py; the pass a mode runs:
app/modes.py.)

Made for cron (``* * * * * hetsched replan --throughputs profiles.csv``):

* **Lock.** A lock file (filelock: ``flock``) serialises runs; a second run exits at once
  with code 75 (or waits ``--wait`` seconds). The kernel drops the lock when a
  run dies, so a crash never leaves it stuck.
* **Idempotent and quiet.** It polls once (see monitor.py); without unhandled
  reset events it does nothing and prints nothing. Events are marked handled
  only after Slurm was brought in line, so a failed run is retried next time.
* **What changes.** The work not yet done (pending jobs, the remainder of
  running jobs estimated from their elapsed time, new jobs from the spool
  directory) is planned again by ``hetsched.app.plan.plan_jobs`` on the
  partition as Slurm reports it now, starting from where the running jobs run
  (they have run: moving one costs the restart), so the evaluator's one
  keep-or-move rule (planning/space/decide.py) keeps or moves each running job;
  a moved one is resubmitted on its new GPUs and resumes from its checkpoint.
  A pending job whose first-segment workers change is changed in place or
  resubmitted (replan_changes.py). A job that failed is resubmitted, at most ``max_failures``
  times. Completed jobs are done; a job the user cancelled (``scancel`` or
  ``hetsched cancel``) is final.

Exit codes (also in docs/slurm.md): 0 ok (changed or not), 1 unexpected
error, 2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6-10 state
file unusable (docs/reliability.md), 75 another replan holds the lock.

Size: one use case whose steps (poll, work left, plan, decide, apply) read top to
bottom here; the decision and the change table are already in replan_changes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hetsched import config
from hetsched.app.plan import PlanInputs, how_planned, plan_jobs
from hetsched.app.replan_changes import (
    Decision,
    after_in_place,
    decide_changes,
    ended_meanwhile,
    update_dependencies,
)
from hetsched.app.replan_inplace import update_in_place
from hetsched.app.replan_pass import (
    FAILED_STATES,
    RUNNING_STATES,
    ReplanResult,
    latest_rows,
    loaded,
    poll_reset_events,
)
from hetsched.app.runnable import split_placeable
from hetsched.app.space_submit import submit_space
from hetsched.app.submission import files_dir
from hetsched.core.plan import JobPlan, Plan
from hetsched.core.spec import Job
from hetsched.errors import HetschedError, InputError
from hetsched.io.files import atomic_write, private_dir
from hetsched.io.jobfiles import JobFiles, batch_of
from hetsched.io.plan_json import plan_from_dict
from hetsched.io.specs import load_jobs
from hetsched.io.yamlfile import read_yaml
from hetsched.slurm.client import SlurmClient
from hetsched.slurm.inventory import load_inventory
from hetsched.state.progress import epochs_reported, progress_points, run_key
from hetsched.state.store import (
    CANCELLED,
    GAVE_UP,
    SUPERSEDED,
    Store,
    Submission,
)

_log = logging.getLogger("hetsched.replan")


def _elastic_in_place(store: Store, new_plan: Plan, rows: dict[str, Submission], dec: Any,
                      result: ReplanResult, log: Callable[[str], None], dry_run: bool) -> None:
    """Running elastic jobs that keep their GPUs are rescaled in place, not restarted."""
    for jp in new_plan.jobs:
        cur = rows.get(jp.name)
        if cur is not None and cur.state in RUNNING_STATES and jp.segments and jp.spec \
                and jp.spec.elastic and _rescale_in_place(
                    jp.name, [w.to_dict() for w in jp.segments[0].workers], cur.workers, log,
                    dry_run, JobFiles.of(files_dir(store), new_plan, jp.name).checkpoint):
            dec.to_submit.discard(jp.name)
            dec.to_cancel[:] = [c for c in dec.to_cancel if c.job != jp.name]
            result.kept += [] if jp.name in result.kept else [jp.name]


def _rescale_in_place(name: str, new: list[dict[str, Any]], old: list[dict[str, Any]],
                      log: Callable[[str], None], dry_run: bool, checkpoint: Path) -> bool:
    """An elastic running job on the same GPUs switches shares at a step (runtime/elastic.py).

    True when its GPUs stay (it is then kept, not restarted); the rescale
    request is written when its batches differ.
    """
    from hetsched.core.plan import worker_groups
    from hetsched.runtime.elastic import request_path, write_request

    if sorted((w["node"], w["gpu_type"]) for w in new) != \
            sorted((w["node"], w["gpu_type"]) for w in old):
        return False
    batches = [b for _, _, bs in worker_groups(new) for b in bs]
    if batches != [b for _, _, bs in worker_groups(old) for b in bs] and not dry_run:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)  # before its first save
        seq = write_request(request_path(checkpoint), batches)
        log(f"job {name}: rescale in place to {batches} (request {seq})")
    return True


def held_gpus(rows: dict[str, Submission], names: set[str]) -> dict[str, list[tuple[str, int]]]:
    """The placement hint for the planner: each queued job's GPUs in Slurm now.

    Running jobs first, then pending ones in submission order (the placer's
    priority when two hints overlap). With it a job the new plan gives the
    same per-type counts keeps its nodes, so its Slurm job is left alone.
    """
    live = [r for n, r in rows.items() if n in names and r.slurm_id and r.workers
            and (r.state in RUNNING_STATES or r.state == "PENDING")]
    live.sort(key=lambda r: (r.state not in RUNNING_STATES, r.id))
    return {r.job: [(str(w["node"]), int(w["gpu"])) for w in r.workers] for r in live}


class StoredPlans:
    """The store's plans, each read and parsed once per pass (typed; None if absent or no
    longer valid): a pass asks for the same plan once per job row."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._plans: dict[str, Plan | None] = {}
        self._jobs: dict[str, dict[str, JobPlan]] = {}

    def get(self, plan_id: str | None) -> Plan | None:
        if not plan_id:
            return None
        if plan_id not in self._plans:
            plan = self._plans[plan_id] = _stored_plan(self.store, plan_id)
            self._jobs[plan_id] = {j.name: j for j in plan.jobs} if plan is not None else {}
        return self._plans[plan_id]

    def job(self, plan_id: str | None, name: str) -> JobPlan | None:
        """Job ``name`` of plan ``plan_id``, or None."""
        return self._jobs.get(plan_id or "", {}).get(name) if self.get(plan_id) else None


def _stored_plan(store: Store, plan_id: str | None) -> Plan | None:
    """A plan from the store, typed; None if absent or no longer valid."""
    raw = store.plan(plan_id) if plan_id else None
    if raw is None:
        return None
    try:
        return plan_from_dict(raw, f"stored plan {plan_id}")
    except InputError:
        return None


def batches_of(plans: StoredPlans, rows: dict[str, Submission], names: list[str]
               ) -> dict[str, str]:
    """Each continuing job's batch (io/jobfiles.py), from the plan it was last submitted
    with: a replanned job keeps its checkpoint and reports."""
    return {name: _batch(plans, rows[name].plan_id, name) for name in names if name in rows}


def _batch(plans: StoredPlans, plan_id: str, name: str) -> str:
    """The batch job ``name`` of plan ``plan_id`` belongs to."""
    plan = plans.get(plan_id)
    return batch_of(plan if plan is not None else {"plan_id": plan_id}, name)


def _failures(store: Store, plans: StoredPlans, row: Submission) -> int:
    """How often ``row``'s job failed in its own batch: a later batch reusing the name
    starts from none."""
    batch = _batch(plans, row.plan_id, row.job)
    return sum(1 for s in store.submissions(job=row.job)
               if s.state in FAILED_STATES and _batch(plans, s.plan_id, row.job) == batch)


def replan_space(store: Store, client: SlurmClient, table: Any, *, policy: str | None = None,
                 partition: str | None = None, spool: str | Path | None = None,
                 force: bool = False, dry_run: bool = False, max_failures: int = 2,
                 log: Callable[[str], None] = lambda _m: None,
                 online: bool | None = None) -> ReplanResult:
    """One space-mode replan pass (see module doc). The caller holds the lock.

    ``online`` (default: setting ``replan_online``): started jobs stay on their GPUs
    until they end (the plan starts them there, fixed: ``running_fixed``).
    """
    online = bool(config.get("replan_online")) if online is None else online
    active = store.active_plan()
    cycle, pending_events, reason = poll_reset_events(store, client, partition, spool, log)
    if not pending_events and not force:
        return ReplanResult("unchanged", "no reset events")
    rows = latest_rows(store)
    now = time.time()
    result = ReplanResult("replanned", reason, dry_run=dry_run)
    plans = StoredPlans(store)
    jobs, running_gpus, done_epochs = _work_left(store, plans, rows, cycle, result, now=now,
                                               dry_run=dry_run, max_failures=max_failures,
                                               log=log)
    rows, spool_files, fresh = _spool_in(pending_events, jobs, rows, result, log, dry_run)

    def unchanged(why: str) -> ReplanResult:
        if not dry_run:
            store.mark_handled([e["id"] for e in pending_events])
            _retire_spool(spool_files)
        result.status, result.reason = "unchanged", f"{reason}; {why}"
        return result

    if not jobs:
        return unchanged("no work left")

    old_id = (active or {}).get("plan_id")  # the poll above never changes the active plan
    settings = _settings(plans.get(old_id), policy)
    cluster, table = load_inventory(client, partition).cluster, loaded(table)
    # a job that cannot be placed now (its GPU type's nodes are down, ...) waits;
    # the rest is replanned: one such job must never wedge replanning
    jobs = _placeable_now(store, jobs, cluster, table, result, dry_run=dry_run, log=log)
    _hold_spool_waiting(fresh, dict(result.waiting), result, dry_run=dry_run)
    if not jobs:
        return unchanged("no job can be placed now")
    new_plan = plan_jobs(PlanInputs(jobs, cluster, table, progress_points(store), "replan"),
                         settings, prefer_gpus=held_gpus(rows, {j.name for j in jobs}),
                         running_gpus={n: g for n, g in running_gpus.items()
                                       if n in {j.name for j in jobs}},
                         running_fixed=online, epochs_done=done_epochs)
    new_plan.notes.replan_of, new_plan.notes.replanned_at = old_id, round(now, 3)
    batches = batches_of(plans, rows, [j.name for j in new_plan.jobs])
    if batches:
        new_plan.notes.batches = batches
    new_plan.plan_id = None  # a fresh content hash: unique per replan
    new = new_plan.to_dict()
    new_plan.plan_id = new["plan_id"]
    result.new_plan_id = new["plan_id"]
    result.plan = new

    dec = decide_changes(new_plan, rows, failed=FAILED_STATES, running=RUNNING_STATES,
                         restart_cost_s=settings.restart_cost_s)
    to_submit, to_cancel = dec.to_submit, dec.to_cancel
    result.kept = dec.kept
    result.changes = dec.changes
    _elastic_in_place(store, new_plan, rows, dec, result, log, dry_run)
    to_submit, to_cancel = dec.to_submit, dec.to_cancel
    if dry_run:
        result.status = "dry-run"
        result.submitted = [(n, "(dry-run)") for n in sorted(to_submit)]
        result.cancelled = [(r.job, r.slurm_id or "?") for r in to_cancel]
        result.updated = [(r.job, r.slurm_id or "?") for r in dec.to_update]
        return result

    _apply(store, client, new_plan, dec, result, partition, reason=reason, old_id=old_id)
    store.mark_handled([e["id"] for e in pending_events])
    _retire_spool(spool_files)
    if not result.changed:
        result.status = "unchanged"
        result.reason = f"{reason}; plan unchanged for queued jobs"
    return result


def _apply(store: Store, client: SlurmClient, new_plan: Plan, dec: Any, result: ReplanResult,
           partition: str | None, *, reason: str, old_id: str | None) -> None:
    """Bring Slurm in line with ``new_plan`` inside a recorded replan (failures recorded)."""
    new_id = new_plan.plan_id
    rid = store.begin_replan(reason, old_id)
    try:
        _bring_in_line(store, client, new_plan, dec, result, partition)
    except BaseException as e:
        store.finish_replan(rid, f"failed: {e}"[:500], new_id)
        raise
    store.finish_replan(rid, "ok", new_id, [i for _, i in result.cancelled],
                        [i for _, i in result.submitted])


def _retire_spool(spool_files: list[Path], folder: str = "done", why: str = "") -> None:
    """Move the jobs files taken from the spool to its done/ (or another) folder, never
    over an earlier one of the same name (the same jobs file spooled again); ``why``
    goes beside the moved file, in FILE.why, for whoever finds it there later."""
    for p in spool_files:
        private_dir(p.parent / folder)
        dest = _free_name(p.parent / folder, p)
        with contextlib.suppress(OSError):
            p.rename(dest)
            # a reason put back with the file (mv waiting/* .) is an earlier pass's
            p.with_name(p.name + ".why").unlink(missing_ok=True)
            if why:
                _say_why(dest, why)


def _say_why(dest: Path, why: str) -> None:
    """``dest``.why: one line per reason, stamped (the spool reads only *.yaml/*.yml)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    atomic_write(dest.with_name(dest.name + ".why"), f"{stamp} hetsched replan: {why}\n")


def _free_name(folder: Path, p: Path) -> Path:
    """``folder/p.name``, or ``folder/STEM-2.SUFFIX`` (3, ...) where that is taken."""
    dest, k = folder / p.name, 1
    while dest.exists():
        k += 1
        dest = folder / f"{p.stem}-{k}{p.suffix}"
    return dest


def _settings(old: Plan | None, policy: str | None) -> Any:
    """The new plan's settings: the active space plan's own; after an ended pool plan
    (app/modes.replan_mode), whose jobs are done, a space plan's defaults."""
    return how_planned(old if old is not None and old.mode == "space" else None, policy)


def _spool_in(pending_events: list[dict[str, Any]], jobs: list[Job],
              rows: dict[str, Submission], result: ReplanResult, log: Callable[[str], None],
              dry_run: bool) -> tuple[dict[str, Submission], list[Path], dict[str, Path]]:
    """Take the spooled jobs into ``jobs`` (:func:`_take_spool`); the rows without those
    that reuse a finished job's name (a new job: the old row is out of this pass, not
    kept, moved or resumed from, and its batch is not the new one's), the files taken
    and the new jobs' files."""
    final = {*result.done, *result.user_cancelled, *result.given_up}
    files, fresh = _take_spool(pending_events, jobs, {j.name for j in jobs}
                               | (set(rows) - final), result, log, dry_run=dry_run)
    return {n: r for n, r in rows.items() if n not in fresh}, files, fresh


def _take_spool(pending_events: list[dict[str, Any]], jobs: list[Job], live: set[str],
                result: ReplanResult, log: Callable[[str], None], *, dry_run: bool = False
                ) -> tuple[list[Path], dict[str, Path]]:
    """Append the new jobs of spooled jobs files to ``jobs``; the files taken and the
    names appended. A job named like one still queued, running or to be resubmitted
    (``live``) is left out, and said; a finished job's name may be used again. A file
    that does not load is said and moved to ``SPOOL/rejected/``: one bad file must never
    wedge replanning (its event would fail every pass)."""
    spool_files: list[Path] = []
    fresh: dict[str, Path] = {}  # job -> the file it came from
    for e in pending_events:
        if e["kind"] == "spool-new" and e["detail"]:
            p = Path(e["detail"])
            if not p.exists():
                continue
            try:
                spooled = load_jobs(p)
            except HetschedError as err:
                log(f"spool {p}: rejected: {err}")
                result.spool_rejected.append(str(err))
                if not dry_run:
                    _retire_spool([p], "rejected", f"rejected: {err}")
                continue
            for j in spooled:
                if j.name in live or j.name in fresh:
                    log(f"spool {p}: job {j.name!r} is already queued or running; ignored")
                    result.spool_ignored.append((j.name, p.name))
                    continue
                jobs.append(dataclasses.replace(j, arrival_s=0.0))
                fresh[j.name] = p
            spool_files.append(p)
    return spool_files, fresh


def _hold_spool_waiting(fresh: dict[str, Path], waiting: dict[str, str], result: ReplanResult,
                        *, dry_run: bool) -> None:
    """Keep the spooled jobs that cannot be placed now in ``SPOOL/waiting/`` (their own
    entries of their file, nothing else), to be put back in the spool once they can run:
    no submission holds them yet, so retiring their file would lose them."""
    import yaml

    by_file: dict[Path, set[str]] = {}
    for name in waiting.keys() & set(fresh):
        by_file.setdefault(fresh[name], set()).add(name)
    for p, names in sorted(by_file.items()):
        dest = _free_name(p.parent / "waiting", p)
        if not dry_run:
            data = read_yaml(p)
            entries = data.get("jobs") if isinstance(data, Mapping) else data
            kept = [e for e in entries or [] if isinstance(e, Mapping)
                    and str(e.get("name")) in names]
            doc = {**data, "jobs": kept} if isinstance(data, Mapping) else kept
            private_dir(dest.parent)
            atomic_write(dest, yaml.safe_dump(doc, sort_keys=False))
            _say_why(dest, "; ".join(f"{n} waits, cannot be placed now: {waiting[n]}"
                                     for n in sorted(names)))
        result.spool_waiting += [(n, str(dest)) for n in sorted(names)]


def _placeable_now(store: Store, jobs: list[Job], cluster: Any, table: Any,
                   result: ReplanResult, *, dry_run: bool,
                   log: Callable[[str], None]) -> list[Job]:
    """The jobs that can be placed now; the others wait (recorded, said): never a wedge."""
    jobs, waiting = split_placeable(jobs, cluster, table)
    for job, why in waiting:
        log(f"job {job.name}: waits, cannot be placed now: {why}")
        result.waiting.append((job.name, why))
        if not dry_run:
            store.add_event("job-waiting", job=job.name, detail=why, handled=True)
    return jobs


def _bring_in_line(store: Store, client: SlurmClient, new_plan: Plan, dec: Decision,
                   result: ReplanResult, partition: str | None) -> None:
    """Update in place, submit, cancel what ``dec`` says (replan_changes.py).

    In-place updates come first: one Slurm refuses is resubmitted in the same
    pass, and the plan they point at is stored before any row names it.
    """
    ended_meanwhile(dec, client)  # a user's scancel while this pass planned stays final
    store.add_plan(new_plan.to_dict(), source="replan")
    ip = update_in_place(store, client, new_plan,
                         [(r, new_plan.job(r.job)) for r in dec.to_update])
    rows = {r.job: r for r in dec.to_update}
    after_in_place(dec, rows, ip.started, ip.refused)
    result.updated = ip.updated
    if dec.to_submit:
        # new hetjobs first: if this fails, the old ones are still queued
        res = submit_space(new_plan, store, client, only=dec.to_submit, partition=partition,
                     source="replan", allow_active_elsewhere=True, check_runnable=False)
        result.submitted = res.submitted + res.skipped
    else:
        store.add_plan(new_plan.to_dict(), source="replan")
    # marked before scancel, so no monitor reads hetsched's cancel as a user's
    with store.tx():
        for r in dec.to_cancel:
            store.set_state(r.id, SUPERSEDED)
    client.cancel([r.slurm_id for r in dec.to_cancel if r.slurm_id])
    result.cancelled = [(r.job, r.slurm_id or "") for r in dec.to_cancel]
    latest = latest_rows(store).values()
    ids = {r.job: r.slurm_id for r in latest if r.slurm_id}
    result.changes += update_dependencies(  # every pending job: the new plan's order
        new_plan, result.kept + [j for j, _ in ip.updated + result.submitted], ids, client,
        {r.job: r.workers for r in latest})


def _work_left(store: Store, plans: StoredPlans, rows: dict[str, Submission], cycle: Any,
               result: ReplanResult,
               *, now: float, dry_run: bool, max_failures: int,
               log: Callable[[str], None]
               ) -> tuple[list[Job], dict[str, list[tuple[str, int]]], dict[str, float]]:
    """The jobs to plan again (the rest of running ones), per running job the
    (node, GPU index) it runs on, and per ``target_loss`` job the epochs it has run in
    all (its length is predicted again from there): its own epoch reports where the
    store has them, else the epochs its plan says it ran before (``epochs_done``) plus
    its planned epochs times the share of its planned time that has passed; done,
    cancelled and given-up jobs go to ``result``."""
    jobs: list[Job] = []
    done_epochs: dict[str, float] = {}
    measured = epochs_reported(store)  # the jobs' own epoch reports beat the estimate
    running_gpus: dict[str, list[tuple[str, int]]] = {}  # running job -> its GPUs now
    for name, row in rows.items():
        if row.state == "COMPLETED":
            result.done.append(name)
            continue
        if row.state == CANCELLED:  # the user's cancel is final
            result.user_cancelled.append(name)
            continue
        if row.state == GAVE_UP:
            result.given_up.append(name)
            continue
        if row.state in FAILED_STATES:
            fails = _failures(store, plans, row)
            if fails > max_failures:
                result.given_up.append(name)
                why = (f"failed {fails} times ({row.state}), more than --max-failures "
                       f"{max_failures}; not resubmitted")
                log(f"job {name}: gave up: {why}")
                result.gave_up_now.append(name)
                if not dry_run:
                    store.set_state(row.id, GAVE_UP)
                    store.add_event("job-given-up", job=name, slurm_id=row.slurm_id,
                                    detail=why, handled=True)
                continue
        plan = plans.get(row.plan_id)
        jp = plans.job(row.plan_id, name)
        if jp is None or jp.spec is None or (plan is not None and plan.mode == "pool"):
            log(f"job {name}: no usable spec in plan {row.plan_id} (or a pool plan's job: "
                "replanned with its pool plan); left as is")
            continue
        job = jp.spec
        frac = 1.0
        if row.state in RUNNING_STATES:
            starts = [c.start_time for c in cycle.infos.get(name, []) if c.start_time]
            planned = jp.end_s - jp.start_s
            if starts and planned > 0:
                frac = max(0.05, 1.0 - (now - min(starts)) / planned)
            if row.workers:  # the plan starts it there (online: fixed there until it ends)
                running_gpus[name] = [(str(w["node"]), int(w["gpu"])) for w in row.workers]
        if job.epochs_predicted:  # its length is predicted again from what it has run
            own = run_key(JobFiles.of(files_dir(store), plan, name).report, name) \
                if plan is not None else ""  # this batch's run, not an earlier one's
            ran = measured.get(own, jp.epochs_done + job.epochs * (1.0 - frac))
            if ran > 0:
                done_epochs[name] = ran
        jobs.append(dataclasses.replace(job, arrival_s=0.0, epochs=job.epochs * frac))
    return jobs, running_gpus, done_epochs
