"""Change a pending job in place: ``scontrol update`` of its components, then its layout.

A replan that gives a *pending* job other GPUs keeps its Slurm job (id, queue
age) when Slurm allows the change, checked on Slurm 22.05 (testbed):

* each component's GPU count (``Gres=gpu:N``), task and CPU count
  (``NumTasks``, ``NumCPUs``) and node (``ReqNodeList``) can be updated. The
  script asks pinned components for *untyped* GPUs on their node, because a
  GRES *type* update leaves the job never runnable (``BadConstraints``); the
  node decides the type;
* a hetjob's components are addressed as ``LEADER+K``, but scontrol refuses a
  node list there ("Invalid job ID"), and on the leader's own id (which
  updates every component: "Job resizing not supported for job arrays"); a
  later component's node list goes through its own job id. So a hetjob's
  *first* component cannot move to another node: one of the new groups must
  sit on that node (any group can take any component: the layout file says
  which is which);
* components cannot be added or removed.

Each component's ``ExcNodeList`` (Slurm fills it with the other components'
nodes at submission) is reset to the other components' new nodes. When Slurm
accepted every update, the job's layout file (io/layout.py) is rewritten to
the new plan; ``hetsched run`` reads it at start and checks it against its
allocation. The time limit and the comment tag follow (best effort: only an
administrator may raise a time limit; the job then keeps its old one and
checkpoints and requeues at it), and a job Slurm requeued (its node failed)
gets ``StartTime=now``: Slurm holds a requeued job for about two minutes
(reason ``BeginTime``, measured on the testbed) for its old node's clean-up,
and it no longer goes there.

A job that started meanwhile keeps running as it was; one that Slurm refused
is cancelled and resubmitted (replan.py), with Slurm's reason in the change table.
Known limit: a hetjob is updated component by component; one that starts
between two of these calls gets a layout that matches no allocation, fails
its launcher's check after ``LAYOUT_WAIT_S`` and is resubmitted by the next replan.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsched.app.submission import Site, base_sbatch, files_dir, job_sbatch
from hetsched.core.plan import JobPlan, Plan, Worker, worker_groups
from hetsched.core.sbatch import SbatchOptions, time_minutes
from hetsched.io.files import atomic_write
from hetsched.io.jobfiles import JobFiles, plan_copy
from hetsched.io.layout import Layout, groups_of, job_layout, write_layout
from hetsched.io.plan_json import dump_plan
from hetsched.slurm.client import JobInfo, SlurmClient
from hetsched.slurm.runner import CommandError
from hetsched.slurm.templates import submission_comment
from hetsched.state.store import SUPERSEDED, Store, Submission


def component_order(old: Sequence[Worker | Mapping[str, Any]],
                    new: Sequence[Worker | Mapping[str, Any]]) -> tuple[list[int] | None, str]:
    """For each of the job's components (Slurm's order), the new group that takes it.

    ``None`` and why when Slurm cannot make the change in place. Groups that
    stay on a component's node keep that component.
    """
    was = worker_groups(old)
    now = worker_groups(new)
    if len(was) != len(now):
        return None, (f"{len(was)} -> {len(now)} hetjob components: Slurm cannot add or "
                      "remove components of a pending job")
    free = list(range(len(now)))
    order: list[int | None] = [None] * len(was)
    for k, (_, node, _) in enumerate(was):
        hit = next((g for g in free if now[g][1] == node), None)
        if hit is not None:
            order[k] = hit
            free.remove(hit)
    if len(was) > 1 and order[0] is None:
        return None, (f"its first component would leave {was[0][1]}: Slurm 22.05's scontrol "
                      "cannot change the node list of a hetjob's first component")
    for k in range(len(order)):
        if order[k] is None:
            order[k] = free.pop(0)
    return [int(g) for g in order if g is not None], ""


def ordered_workers(new: Sequence[Mapping[str, Any]], order: list[int]) -> list[dict[str, Any]]:
    """The new workers in the job's component order (so worker_groups gives that order)."""
    groups = worker_groups(new)
    out: list[dict[str, Any]] = []
    for g in order:
        t, n, _ = groups[g]
        out += [dict(w) for w in new if str(w["gpu_type"]) == t and str(w["node"]) == n]
    return out


def layout_of(store: Store, sub: Submission) -> Path:
    """The layout file a submission's script names (io/jobfiles.py)."""
    return JobFiles(files_dir(store), sub.plan_id, sub.job, sub.segment).layout


def _fields(workers: list[dict[str, Any]], comps: list[JobInfo], lead: str, cpus: int = 1
            ) -> list[tuple[str, list[str]]]:
    """The scontrol updates, one per component: (job id to address, KEY=VALUE...);
    ``cpus``: CPU cores per GPU (each task's)."""
    groups = worker_groups(workers)
    out = []
    for k, (_, node, batches) in enumerate(groups):
        n = len(batches)
        upd = [f"Gres=gpu:{n}", f"NumTasks={n}", f"NumCPUs={n * cpus}"]
        if len(groups) == 1:
            out.append((lead, [*upd, f"ReqNodeList={node}"]))
            continue
        others = ",".join(g[1] for j, g in enumerate(groups) if j != k)
        upd = [f"ExcNodeList={others}", *upd]
        if k == 0:  # its node stays (component_order); L+0 updates this component only
            out.append((f"{lead}+0", upd))
        else:
            out.append((comps[k].job_id, [*upd, f"ReqNodeList={node}"]))
    return out


@dataclass
class InPlaceResult:
    updated: list[tuple[str, str]] = field(default_factory=list)  # (job, slurm id)
    started: list[str] = field(default_factory=list)  # began before it could be changed
    refused: dict[str, str] = field(default_factory=dict)  # job -> Slurm's reason


def _opts(jp: JobPlan) -> SbatchOptions:
    """The job's sbatch options: its spec's over the config's."""
    return job_sbatch(jp.spec, base_sbatch())


def _limit_min(jp: JobPlan, site: Site) -> int:
    opts = _opts(jp)
    if opts.time:  # the user's: submit checked it against MaxTime
        return time_minutes(opts.time)
    s = jp.segments[0]
    return site.limit(jp.name, opts, s.end_s - s.start_s)[0]


def update_in_place(store: Store, client: SlurmClient, plan: Plan,
                    jobs: list[tuple[Submission, JobPlan]]) -> InPlaceResult:
    """Change each pending job to its new plan's first segment (module doc)."""
    res = InPlaceResult()
    if not jobs:
        return res
    pid = str(plan.plan_id)
    plan_path = plan_copy(files_dir(store), pid)
    if not plan_path.exists():
        atomic_write(plan_path, dump_plan(plan) + "\n")
    comps: dict[str, list[JobInfo]] = {}
    for j in client.jobs():
        comps.setdefault(j.leader, []).append(j)
    sites: dict[str, Site] = {}  # partition -> its MaxTime (one sinfo per partition)
    for sub, jp in jobs:
        assert sub.slurm_id is not None
        mine = sorted(comps.get(sub.slurm_id, []), key=lambda c: c.het_offset or 0)
        if not mine or any(c.state != "PENDING" for c in mine):
            res.started.append(sub.job)
            continue
        new = [w.to_dict() for w in jp.segments[0].workers]
        order, why = component_order(sub.workers, new)
        if order is None or len(mine) != len(order):
            res.refused[sub.job] = why or "Slurm shows another number of components"
            continue
        workers = ordered_workers(new, order)
        try:
            # each task keeps the CPU cores it was submitted with: its --cpus-per-task,
            # else the partition's DefCpuPerGPU (NumCPUs is set, so Slurm would not
            # apply that default to the new GPU count)
            cpus = (mine[0].cpus_per_task or mine[0].cpus_per_gpu or _opts(jp).cpus_per_gpu
                    or 1)
            for k, (jid, upd) in enumerate(_fields(workers, mine, sub.slurm_id, cpus)):
                try:
                    client.update_job(jid, upd)
                except CommandError as e:
                    if k == 0 and "pending" in str(e).lower():
                        res.started.append(sub.job)  # it started: runs as it was
                        raise StopIteration from None
                    raise
        except StopIteration:
            continue
        except CommandError as e:
            res.refused[sub.job] = f"scontrol update refused: {e}"[:300]
            continue
        # requeued (a node failed under it): Slurm holds it ~2 min (BeginTime) for the old
        # node's clean-up; it no longer goes there, so it may start at once
        # (right after the requeue the reason is still "None", the begin time already set)
        requeued = any(c.restarts and (c.reason == "BeginTime" or c.start_time > time.time())
                       for c in mine)
        part = mine[0].partition
        if part not in sites:
            sites[part] = Site(part or None,
                               max_time_min=client.partition_info(part or None).max_time_min)
        _commit(store, client, sub, jp, pid, plan, plan_path, workers, sites[part], requeued)
        res.updated.append((sub.job, sub.slurm_id))
    return res


def _commit(store: Store, client: SlurmClient, sub: Submission, jp: JobPlan, pid: str,
            plan: Plan, plan_path: Path, workers: list[dict[str, Any]], site: Site,
            requeued: bool = False) -> None:
    """Slurm took the update: the layout, then the best-effort fields, then the rows."""
    assert sub.slurm_id is not None
    pinned = job_layout(plan, pid, plan_path, jp.name, 0)
    write_layout(layout_of(store, sub),
                 Layout(pinned.plan, pid, jp.name, 0, groups_of(worker_groups(workers))))
    for upd in ([f"TimeLimit={_limit_min(jp, site)}"],
                [f"Comment={submission_comment(pid, jp.name, 0)}"],
                ["StartTime=now"] if requeued else []):
        if not upd:
            continue
        try:  # an ordinary user may not raise a time limit: the job keeps its own
            client.update_job(sub.slurm_id, upd)
        except CommandError:
            pass
    row = store.begin_submission(pid, jp.name, 0, sub.script_hash, sub.script_path, workers)
    store.set_submitted(row.id, sub.slurm_id, "PENDING")
    store.set_state(sub.id, SUPERSEDED)
