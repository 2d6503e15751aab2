"""``hetsched status``: every job of the batch as Slurm and the plan see it; read-only.

One ``squeue`` and reads of the state file (opened read-only: no event is
recorded, no file created) and of the jobs' report files. For each job:
its full name, plan, Slurm id, state, Slurm's reason (or hetsched's: why it
waits, why it was given up, who cancelled it), where it runs (nodes and GPU
indices), the actual start and end beside the plan's, the measured JCT
beside the predicted one, the measured against the predicted iteration
time, the log file of a job that failed, and a flag when it runs more than
SLOW times slower than predicted (its JCT or run time also more than
SLOW_GRACE_S seconds over: start-up is not in the plan). Jobs of the active
plan that were never submitted are listed too. A pool plan's jobs share one
Slurm job: one its executors say has ended is COMPLETED at that end.

By default the current batch (the active plan and the plans it was
replanned from) and the jobs of earlier batches still in the queue;
``all_batches`` lists every job the state file knows, once per batch it ran in.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetsched.app.monitor import WATCHED, combined_state, state_counts
from hetsched.app.replan_pass import latest_rows, replanned_from
from hetsched.app.submit import files_dir
from hetsched.io.jobfiles import JobFiles, batch_of, log_cause, log_of, logs_dir
from hetsched.io.reports import read_reports
from hetsched.slurm.client import JobInfo, SlurmClient
from hetsched.slurm.templates import submission_comment
from hetsched.state.store import (
    CANCELLED,
    GAVE_UP,
    SUBMIT_FAILED,
    SUBMITTING,
    SUPERSEDED,
    Store,
    Submission,
)

RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING"})
PENDING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "SUBMITTING", "SUSPENDED"})
NOT_SUBMITTED = "NOT_SUBMITTED"


#: a job measured more than this many times slower than its prediction is flagged
SLOW = 1.5
#: ... and, for its JCT or run time, more than this many seconds over it: the plan
#: leaves out a job's start-up (srun, rendezvous, imports, the first batch), seconds
#: that would flag every job of a few minutes while saying nothing of a long one
SLOW_GRACE_S = 60.0
FAILED_LIKE = frozenset({"FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL",
                         "PREEMPTED", "DEADLINE", "GONE", "GAVE_UP"})


@dataclass
class JobStatus:
    job: str
    plan_id: str
    slurm_id: str
    state: str
    reason: str
    gpus: str
    elapsed_s: float | None
    predicted_start: float | None  # epoch seconds
    predicted_end: float | None
    predicted_iter_s: float | None
    measured_iter_s: float | None
    #: where it runs: "v100-1:0,1 + v100-2:3" (node: GPU indices, from the plan's workers)
    placement: str = ""
    actual_start: float | None = None  # epoch seconds, from Slurm
    actual_end: float | None = None  # only once the job ended
    predicted_jct_s: float | None = None
    measured_jct_s: float | None = None  # once it ended: end - (plan start + arrival)
    log: str | None = None  # the Slurm output file of a job that failed
    cause: str = ""  # that log's last line from the job's program (io.jobfiles.log_cause)
    slow: str = ""  # why it is flagged (measured > SLOW x predicted), "" when not


def counts(jobs: list[JobStatus]) -> dict[str, int]:
    """running / pending / done / failed / other, as ``watch`` prints them."""
    out = {"running": 0, "pending": 0, "done": 0, "failed": 0, "other": 0}
    for j in jobs:
        if j.state in RUNNING:
            out["running"] += 1
        elif j.state in PENDING:
            out["pending"] += 1
        elif j.state == "COMPLETED":
            out["done"] += 1
        elif j.state in (NOT_SUBMITTED, CANCELLED):
            out["other"] += 1
        else:
            out["failed"] += 1
    return out


#: states a replan leaves as they are: done, cancelled by the user, given up
FINAL = frozenset({"COMPLETED", CANCELLED, GAVE_UP})


def replan_has_work(jobs: list[JobStatus]) -> bool:
    """Whether a replan could change anything for these jobs (one is not final)."""
    return any(j.state not in FINAL for j in jobs)


def _measured_iter_s(report: Path, last: int = 5) -> float | None:
    recs, _ = read_reports(report)
    steps = [float(r["step_s"]) for r in recs
             if r.get("kind") == "steps" and isinstance(r.get("step_s"), (int, float))]
    return sum(steps[-last:]) / len(steps[-last:]) if steps else None


def _pool_ended(store: Store, plan: dict[str, Any] | None, row: Submission,
                pools: dict[str, dict[str, tuple[float, float]]]) -> tuple[float, float] | None:
    """A pool plan's job that its executors say has ended: (first task's start, end);
    None for any other job (read once per plan into ``pools``)."""
    if (plan or {}).get("mode") != "pool":
        return None
    if row.plan_id not in pools:
        from hetsched.app.pool_status import ended_jobs

        pools[row.plan_id] = ended_jobs(store, plan or {})
    return pools[row.plan_id].get(row.job)


def _measured(store: Store, plan: dict[str, Any] | None, row: Submission, name: str,
              pools: dict[str, dict[str, tuple[float, float]]]) -> float | None:
    """A job's measured seconds per iteration: its report's last steps, or, in a pool plan
    (whose executors report tasks), its span from first task to end over its iterations
    once it has ended."""
    if (plan or {}).get("mode") == "pool":
        from hetsched.app.pool_status import iteration_s

        span = _pool_ended(store, plan, row, pools)
        return iteration_s(plan or {}, name, span) if span is not None else None
    return _measured_iter_s(JobFiles(files_dir(store), row.plan_id, name, row.segment,
                                     batch_of(plan or {"plan_id": row.plan_id}, name)).report)


def _last_events(store: Store) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for e in store.events(limit=5000):
        if e["job"] and e["kind"] in ("job-waiting", "job-given-up", "job-cancelled"):
            out[(e["job"], e["kind"])] = e
    return out


def _hetsched_reason(row: Submission, events: dict[tuple[str, str], dict[str, Any]],
                     live: str = "") -> str:
    if row.state == GAVE_UP and (row.job, "job-given-up") in events:
        return "gave up: " + events[(row.job, "job-given-up")]["detail"]
    if row.state == CANCELLED and (row.job, "job-cancelled") in events:
        detail = events[(row.job, "job-cancelled")]["detail"]
        try:
            d = json.loads(detail)
            return f"cancelled by {d.get('by')}" + (f": {d['reason']}" if d.get("reason") else "")
        except (ValueError, AttributeError):
            return detail
    wait = events.get((row.job, "job-waiting"))
    if wait is not None and wait["at"] >= row.updated and live not in RUNNING | {"COMPLETED"}:
        # a job that runs (or ran) again no longer waits, whatever the last replan said
        return "waits: " + wait["detail"]
    return ""


def _live(row: Submission, comps: list[JobInfo], events: dict[tuple[str, str], dict[str, Any]],
          adopted: str, pool_done: tuple[float, float] | None
          ) -> tuple[str, str, list[float], list[float]]:
    """A job's state, reason, start and end times from its Slurm job's components. A pool
    job that its executors say has ended (``pool_done``: first task's start, end) is
    COMPLETED at that end, not at its pool's: the pool's Slurm job runs on (or ran on)
    for the others."""
    # a job dropped from a pool is cancelled although the pool's Slurm job runs on
    state = combined_state(comps) if comps and row.state != CANCELLED else row.state
    starts = [float(c.start_time) for c in comps if c.start_time]
    ends = [float(c.end_time) for c in comps if c.end_time]
    if pool_done is not None and state in RUNNING:
        return "COMPLETED", "ended; its pool runs on for the other jobs", starts, [pool_done[1]]
    if pool_done is not None and state == "COMPLETED":
        ends = [pool_done[1]]
    slurm_reason = ", ".join(sorted({c.reason for c in comps if c.reason
                                     and c.reason != "None"}))
    return state, adopted or _hetsched_reason(row, events, state) or slurm_reason, starts, ends


def current_batch(store: Store) -> set[str] | None:
    """Plan ids of the current batch: the active plan and those it was replanned from.

    None when no plan is active (everything is shown then).
    """
    active = store.active_plan()
    return replanned_from(store, str(active.get("plan_id"))) if active else None


def placement(workers: list[dict[str, Any]]) -> str:
    """``v100-1:0,1 + v100-2:3``: each node and the GPU indices a job's workers use."""
    by: dict[str, list[int]] = {}
    for w in workers:
        gpus = by.setdefault(str(w.get("node", "?")), [])
        if isinstance(w.get("gpu"), int) and w["gpu"] not in gpus:
            gpus.append(int(w["gpu"]))
    return " + ".join(f"{n}:{','.join(map(str, sorted(g)))}" if g else n for n, g in by.items())


def failed_log(store: Store, slurm_id: str | None) -> str | None:
    """The Slurm output file of job SLURM_ID (``%x-%j.out`` in the state's logs dir)."""
    found = log_of(logs_dir(files_dir(store)), slurm_id)
    return str(found) if found else None


def _times(r: float) -> str:
    """``1.7x``; two decimals where one would read as the threshold itself (``1.51x``)."""
    return f"{r:.2f}x" if round(r, 1) <= SLOW else f"{r:.1f}x"


def _over(measured: float, predicted: float) -> bool:
    """A duration more than SLOW times its prediction and SLOW_GRACE_S seconds over it."""
    return measured > SLOW * predicted and measured - predicted > SLOW_GRACE_S


def _slow(st: JobStatus, pred_dur: float | None) -> str:
    """Why this job is flagged as slower than predicted ("" when it is not)."""
    if st.measured_jct_s and st.predicted_jct_s and _over(st.measured_jct_s, st.predicted_jct_s):
        return f"JCT {_times(st.measured_jct_s / st.predicted_jct_s)} the prediction"
    if st.state in RUNNING and st.elapsed_s and pred_dur and _over(st.elapsed_s, pred_dur):
        return f"running {_times(st.elapsed_s / pred_dur)} its predicted time"
    if st.measured_iter_s and st.predicted_iter_s and \
            st.measured_iter_s > SLOW * st.predicted_iter_s:
        return f"iterations {_times(st.measured_iter_s / st.predicted_iter_s)} the prediction"
    return ""


def batch_counts(store: Store) -> dict[str, int]:
    """``watch``'s counts (running, pending, done, failed, cancelled), as the state file
    has them after a poll: the current batch and earlier batches' jobs still live, the
    jobs ``status`` shows; a pool job its executors say has ended counts as done."""
    batch = current_batch(store)
    plans: dict[str, Any] = {}
    pools: dict[str, dict[str, tuple[float, float]]] = {}

    def state(r: Submission) -> str:
        if r.state in RUNNING:
            if r.plan_id not in plans:
                plans[r.plan_id] = store.plan(r.plan_id)
            if _pool_ended(store, plans[r.plan_id], r, pools) is not None:
                return "COMPLETED"
        return r.state

    return state_counts(state(r) for r in latest_rows(store).values()
                        if batch is None or r.plan_id in batch or r.state in WATCHED)


def every_batch(store: Store) -> list[tuple[str, Submission]]:
    """Each job's latest row in every batch (a batch: a submitted plan and the plans
    replans made of it), by job then batch: a job name a later batch reused shows once
    per batch it ran in."""
    root: dict[str, str] = {}
    for r in store.replans():
        if r.get("old_plan") and r.get("new_plan"):
            root[str(r["new_plan"])] = root.get(str(r["old_plan"]), str(r["old_plan"]))
    out: dict[tuple[str, str], Submission] = {}
    for s in store.submissions():
        if s.state not in (SUPERSEDED, SUBMIT_FAILED):
            out[(s.job, root.get(s.plan_id, s.plan_id))] = s  # in id order: the last wins
    return sorted(((job, s) for (job, _), s in out.items()), key=lambda x: (x[0], x[1].id))


def _shown(rows: dict[str, Submission], batch: set[str] | None,
           by_leader: dict[str, list[JobInfo]]) -> dict[str, Submission]:
    """The current batch's rows (all when no plan is active), and those of earlier
    batches whose Slurm job is still queued or running."""
    if batch is None:
        return rows
    return {n: r for n, r in rows.items() if r.plan_id in batch or any(
        not c.finished for c in by_leader.get(r.slurm_id or "", ()))}


def batch_status(store: Store, client: SlurmClient, now: float | None = None,
                 all_batches: bool = False) -> list[JobStatus]:
    """Every job of the batch (see module doc); one ``squeue``, nothing written."""
    now = time.time() if now is None else now
    by_leader: dict[str, list[JobInfo]] = {}
    for j in client.jobs():
        by_leader.setdefault(j.leader, []).append(j)
    created = {p["id"]: float(p["created"]) for p in store.plans()}
    events = _last_events(store)
    batch = current_batch(store)
    shown = (every_batch(store) if all_batches else
             sorted(_shown(latest_rows(store), batch, by_leader).items()))
    out: list[JobStatus] = []
    plans: dict[str, Any] = {}
    pools: dict[str, dict[str, tuple[float, float]]] = {}  # pool plan -> its ended jobs
    tagged = {j.comment: j.leader for j in (c for cs in by_leader.values() for c in cs)
              if j.comment.startswith("hetsched:") and j.mine}
    for name, row in shown:
        sid = row.slurm_id
        adopted = ""
        if sid is None and row.state == SUBMITTING:
            # killed between sbatch and recording the id: find it by its tag
            sid = tagged.get(submission_comment(row.plan_id, name, row.segment))
            adopted = ("sbatch's reply was not recorded (submit killed?); `hetsched "
                       "submit` again adopts it" if sid else
                       "submit was killed before sbatch answered; `hetsched submit` again")
        if row.plan_id not in plans:  # one query per plan, not per row
            plans[row.plan_id] = store.plan(row.plan_id)
        plan = plans[row.plan_id]
        comps = by_leader.get(sid or "", [])
        state, reason, starts, ends = _live(row, comps, events, adopted,
                                            _pool_ended(store, plan, row, pools))
        elapsed = None
        if starts and state in RUNNING:
            elapsed = now - min(starts)
        elif starts and ends and state not in PENDING:
            elapsed = max(ends) - min(starts)
        jp = next((j for j in (plan or {}).get("jobs", []) if j.get("name") == name), None)
        t0 = created.get(row.plan_id)
        seg = (jp or {}).get("segments", [])
        types: dict[str, int] = {}
        for w in row.workers:
            types[str(w["gpu_type"])] = types.get(str(w["gpu_type"]), 0) + 1
        ended = state not in RUNNING and state not in PENDING and bool(ends) and bool(starts)
        arrival = t0 + float(jp.get("arrival_s", 0.0)) if jp and t0 else None
        st = JobStatus(
            job=name, plan_id=row.plan_id, slurm_id=sid or "-", state=state,
            reason=reason, gpus=" ".join(f"{k}x{v}" for k, v in sorted(types.items())),
            elapsed_s=round(elapsed, 1) if elapsed is not None else None,
            predicted_start=round(t0 + jp["start_s"], 1) if jp and t0 else None,
            predicted_end=round(t0 + jp["end_s"], 1) if jp and t0 else None,
            predicted_iter_s=(seg[row.segment].get("iteration_s") or None)
            if len(seg) > row.segment else None,
            measured_iter_s=_measured(store, plan, row, name, pools),
            placement=placement(row.workers),
            actual_start=float(min(starts)) if starts else None,
            actual_end=float(max(ends)) if ended else None,
            predicted_jct_s=round(float(jp["end_s"]) - float(jp.get("arrival_s", 0.0)), 1)
            if jp else None,
            # Slurm's times are whole seconds: never "ended before it arrived"
            measured_jct_s=round(max(0.0, max(ends) - arrival), 1) if ended and arrival
            and state == "COMPLETED" else None,
            log=failed_log(store, sid) if state in FAILED_LIKE else None)
        pred_dur = float(jp["end_s"]) - float(jp["start_s"]) if jp else None
        st.slow, st.cause = _slow(st, pred_dur), log_cause(st.log) if st.log else ""
        out.append(st)
    active = store.active_plan() or {}
    have = {n for n, r in shown if r.plan_id in (batch or ())}
    for jp in active.get("jobs", []):
        if jp.get("name") not in have:
            out.append(JobStatus(str(jp.get("name")), str(active.get("plan_id")), "-",
                                 NOT_SUBMITTED, "in the plan, not submitted", "", None,
                                 None, None, None, None))
    return out


def status_json(jobs: list[JobStatus], commands: int,
                pool: dict[str, Any] | None = None) -> str:
    return json.dumps({"jobs": [asdict(j) for j in jobs], "counts": counts(jobs),
                       "commands": commands, **({"pool": pool} if pool else {})}, indent=2)


def when(t: float | None, now: float) -> str:
    """An epoch time as HH:MM:SS (with +Nd when not today); '-' when unknown."""
    if t is None:
        return "-"
    days = int((t - now) // 86400) if t > now else 0
    return time.strftime("%H:%M:%S", time.localtime(t)) + (f" +{days}d" if days else "")


def state_path_missing(path: Path) -> str:
    return f"no state file at {path}: nothing was submitted with it yet"
