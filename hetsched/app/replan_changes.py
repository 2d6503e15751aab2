"""What a replan changes in Slurm, and why: as little as it can.

* A job with no queued Slurm job (new, or failed) is submitted.
* A **pending** job keeps its Slurm job (id, queue age) when its first
  segment's workers are unchanged; only its ``--dependency`` is rewritten in
  place (``scontrol update``) when the plan's order around it changed. When
  its workers change it is changed in place where Slurm allows it (GRES,
  node list, task count: replan_inplace.py; the script does not carry the
  rank layout, ``hetsched run`` reads it from the layout file), else
  resubmitted (the new job first, then the old one cancelled), the change
  table saying why.
* A **running** job moves when the plan moves it (other GPUs, or the same ones
  only later: paused), and only then. The plan was
  made starting from where the running jobs run (``PlanningProblem.running_gpus``),
  so the evaluator's one keep-or-move rule (planning/space/decide.py: keep,
  fresh or wait, scored by predicted weighted completion time with restart costs)
  made that choice, as it does at every reset event of a simulated plan; the
  change row quotes it (the plan's note ``keep_or_move``). A running job the
  plan could not start where it runs (not in the note's ``started``: a
  co-location group's shared GPUs, GPUs another running job's row also names,
  GPUs no longer in the partition or of a type it may not use) is kept:
  replan never pays a restart the evaluator did not weigh.

* A **co-location group** is one Slurm job (app/group_submit.py): its jobs
  move together. When one member is submitted or cancelled, every member
  that would have been kept is cancelled and resubmitted with it
  (``whole_groups``), whether the group is the old plan's (one Slurm job) or
  the new plan's (one unit to submit).

Every change is reported as a row (job, was, now, why).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetsched.app.order import dependency_expr, waits_for
from hetsched.app.replan_inplace import component_order
from hetsched.core.plan import Plan, Worker
from hetsched.slurm.client import JobInfo, SlurmClient
from hetsched.slurm.runner import CommandError
from hetsched.state.store import Submission


@dataclass(frozen=True)
class Change:
    job: str
    was: str
    now: str
    why: str


@dataclass
class Decision:
    to_submit: set[str] = field(default_factory=set)
    to_cancel: list[Submission] = field(default_factory=list)
    to_update: list[Submission] = field(default_factory=list)  # pending: change in place
    kept: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)


def stored_workers(sub: Submission) -> list[Worker]:
    """A submission's workers (the state store keeps them as dicts), typed."""
    return [Worker(str(w["node"]), str(w["gpu_type"]), int(w["gpu"]), int(w["local_batch"]))
            for w in sub.workers]


def workers_summary(workers: Sequence[Worker]) -> str:
    """``v100-1:2 t4-1:1`` (GPUs per node, in first-seen order)."""
    per: dict[str, int] = {}
    for w in workers:
        per[w.node] = per.get(w.node, 0) + 1
    return " ".join(f"{n}:{k}" for n, k in per.items()) or "-"


def _key(workers: Sequence[Worker]) -> list[tuple[str, str, int]]:
    return sorted((w.node, w.gpu_type, w.local_batch) for w in workers)


def _gpus(workers: Sequence[Worker]) -> list[tuple[str, int]]:
    return sorted((w.node, w.gpu) for w in workers)


def why_moved(plan: Plan, restart_cost_s: float) -> str:
    """A running job the plan moves: why, in the keep-or-move decision's own terms."""
    rec = plan.notes.keep_or_move or {}
    scores = rec.get("weighted_completion_s") or {}
    chosen = str(rec.get("chosen", "?"))
    if chosen in scores and "keep" in scores:
        return (f"running; moving pays: weighted completion {scores[chosen]:.0f} s "
                f"({chosen}) instead of {scores['keep']:.0f} s (keep), restart "
                f"{restart_cost_s:.0f} s included")
    return f"running; moved by the plan ({rec.get('why', chosen)})"


def decide_changes(new_plan: Plan, rows: Mapping[str, Submission], *, failed: frozenset[str],
           running: frozenset[str], restart_cost_s: float = 0.0) -> Decision:
    """Which jobs to submit, which Slurm jobs to cancel, which to keep (module doc).

    A running job the plan started where it runs (the note ``keep_or_move``'s
    ``started``) moves iff the plan gives it other GPUs or pauses it; any other running
    job is kept. ``restart_cost_s``: for the change row only.
    """
    started = set((new_plan.notes.keep_or_move or {}).get("started", ()))
    d = Decision()
    shared = Counter(r.slurm_id for r in rows.values() if r.slurm_id)  # groups: one job
    for jp in new_plan.jobs:
        if not jp.segments:
            continue
        ws = jp.segments[0].workers
        now = workers_summary(ws)
        cur = rows.get(jp.name)
        was = stored_workers(cur) if cur is not None else []
        if cur is None:
            d.to_submit.add(jp.name)
            d.changes.append(Change(jp.name, "-", now, "new job"))
        elif cur.state in failed:
            d.to_submit.add(jp.name)
            d.changes.append(Change(jp.name, f"{cur.state}", now, "failed: resubmitted"))
        elif cur.state in running and jp.name in started:
            # the plan moves it (other GPUs), or pauses it (it starts again later)
            if _gpus(ws) != _gpus(was) or jp.segments[0].start_s > 1e-6:
                d.to_submit.add(jp.name)
                d.to_cancel.append(cur)
                d.changes.append(Change(jp.name, workers_summary(was), now,
                                        why_moved(new_plan, restart_cost_s)
                                        + (f"; waits until {jp.segments[0].start_s:.0f} s"
                                           if jp.segments[0].start_s > 1e-6 else "")))
            else:
                d.kept.append(jp.name)
        elif _key(ws) == _key(was) or cur.state in running:
            d.kept.append(jp.name)
        else:
            order, why = component_order(was, ws)
            if jp.segments[0].group is not None or shared[cur.slurm_id or ""] > 1:
                order, why = None, "a co-location group's job: the group is one Slurm job"
            if order is not None and cur.slurm_id and cur.state == "PENDING":
                d.to_update.append(cur)
                d.changes.append(Change(jp.name, workers_summary(was), now,
                                        IN_PLACE))
                continue
            d.to_submit.add(jp.name)
            d.to_cancel.append(cur)
            d.changes.append(Change(jp.name, workers_summary(was), now,
                                    f"{cur.state.lower()}; new GPUs: resubmitted"
                                    + (f" ({why})" if why else "")))
    whole_groups(d, new_plan, rows)
    return d


IN_PLACE = "pending; new GPUs: updated in place (scontrol update; id kept)"


def after_in_place(d: Decision, rows: Mapping[str, Submission], started: Sequence[str],
                   refused: Mapping[str, str]) -> None:
    """What Slurm did with the in-place updates: a refused one is resubmitted, one
    that started meanwhile runs where it was; the change rows say so."""
    for k, c in enumerate(d.changes):
        if c.why != IN_PLACE:
            continue
        if c.job in refused:
            d.to_submit.add(c.job)
            d.to_cancel.append(rows[c.job])
            d.changes[k] = Change(c.job, c.was, c.now,
                                  f"pending; new GPUs: resubmitted ({refused[c.job]})")
        elif c.job in started:
            d.kept.append(c.job)
            d.changes[k] = Change(c.job, c.was, c.was, "started before it could be changed "
                                  "in place: runs where it was")


def ended_now(client: SlurmClient, ids: set[str]) -> set[str]:
    """The Slurm jobs among ``ids`` (each live when a replan pass read the batch) that
    Slurm shows ended now: one squeue, none when ``ids`` is empty."""
    if not ids:
        return set()
    return ids - {j.leader for j in client.jobs() if not j.finished}


def ended_meanwhile(d: Decision, client: SlurmClient) -> list[str]:
    """The jobs ``d`` would move (cancel and submit again, or change in place) that Slurm
    shows ended since this pass read the batch (one squeue): a user's ``scancel``, or the
    job finished, while the pass planned. Each is left out of ``d`` (not cancelled, not
    submitted again, not updated), so its end stands for the monitor to record: a cancel
    stays final, a finished job does not run again. The change rows say so."""
    rows = d.to_cancel + d.to_update
    ended = ended_now(client, {r.slurm_id for r in rows if r.slurm_id})
    gone = {r.job for r in rows if r.slurm_id in ended}
    if gone:
        d.to_cancel[:] = [r for r in d.to_cancel if r.job not in gone]
        d.to_update[:] = [r for r in d.to_update if r.job not in gone]
        d.to_submit -= gone
        d.changes[:] = [Change(c.job, c.was, "-", "ended while this replan planned (Slurm "
                            "shows it gone): left as it is, for the monitor to record")
                     if c.job in gone else c for c in d.changes]
    return sorted(gone)


def whole_groups(d: Decision, new_plan: Plan, rows: Mapping[str, Submission]) -> None:
    """Move co-location groups whole (module doc): old groups are rows sharing a Slurm
    id, new ones the new plan's first segments with the same group id."""
    blocks: list[set[str]] = []
    new: dict[str, set[str]] = {}
    for jp in new_plan.jobs:
        if jp.segments and jp.segments[0].group is not None:
            new.setdefault(str(jp.segments[0].group), set()).add(jp.name)
    blocks += [m for m in new.values() if len(m) > 1]
    old: dict[str, set[str]] = {}
    for name, r in rows.items():
        if r.slurm_id:
            old.setdefault(r.slurm_id, set()).add(name)
    blocks += [m for m in old.values() if len(m) > 1]
    planned = {jp.name for jp in new_plan.jobs if jp.segments}
    changed = True
    while changed:
        changed = False
        moving = d.to_submit | {r.job for r in d.to_cancel}
        for block in blocks:
            if not block & moving:
                continue
            for name in sorted(block & set(d.kept)):
                d.kept.remove(name)
                d.to_cancel.append(rows[name])
                if name in planned:
                    d.to_submit.add(name)
                d.changes.append(Change(name, workers_summary(stored_workers(rows[name])),
                                        "with its group", "co-location group moves whole: "
                                        "cancelled and resubmitted with it"))
                changed = True


def _dep_ids(info: JobInfo | None) -> set[str]:
    text = getattr(info, "dependency", "") or ""
    out: set[str] = set()
    for part in text.replace("?", ",").split(","):
        if "(" in part and "unfulfilled" not in part:
            continue  # a satisfied or failed dependency no longer holds the job
        out |= {x.split("(")[0] for x in part.split(":")[1:] if x.split("(")[0].isdigit()}
    return out


def update_dependencies(new_plan: Plan, kept: Sequence[str], ids: Mapping[str, str],
                        client: SlurmClient,
                        workers: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
                        ) -> list[Change]:
    """Rewrite, in place, the ``--dependency`` of pending jobs (``kept``: every pending job
    of the new plan) whose order changed: the new plan's order, plus any job running now
    on a GPU the plan gives it (``workers``: each job's recorded workers; app/order.py)."""
    infos = {j.leader: j for j in client.jobs() if not j.het_offset}
    active = {i for i, j in infos.items() if not j.finished}
    run_ids = {i for i, j in infos.items() if j.state in ("RUNNING", "COMPLETING",
                                                           "CONFIGURING")}
    running = {n: w for n, w in (workers or {}).items() if ids.get(n) in run_ids}
    preds = waits_for(new_plan, running)
    by_id = {v: k for k, v in ids.items()}
    out = []
    for name in kept:
        jid = ids.get(name)
        info = infos.get(jid or "")
        if jid is None or info is None or info.state != "PENDING":
            continue
        live = [p for p in preds.get(name, []) if ids.get(p) in active and ids.get(p) != jid]
        want = dependency_expr(live, ids)
        have = _dep_ids(info)
        if set(want.split(":")[1:]) == have:
            continue
        try:
            client.update_dependency(jid, want)
        except CommandError as e:
            # Slurm started it (or it ended: a user's scancel) since the squeue above: what
            # it waits for no longer matters, and the monitor records where it went
            if e.not_pending:
                continue
            raise
        names = lambda s: ", ".join(sorted(by_id.get(i, i) for i in s)) or "-"  # noqa: E731
        out.append(Change(name, f"after {names(have)}", f"after {names(set(want.split(':')[1:]))}",
                          "plan order changed: dependency updated in place (id kept)"))
    return out


def changes_table(changes: Sequence[Change]) -> str:
    """The changes as a plain text table (the CLI and the replan log)."""
    if not changes:
        return ""
    rows = [("job", "was", "now", "why")] + [(c.job, c.was, c.now, c.why) for c in changes]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}" for r in rows)
