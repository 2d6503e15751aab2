"""Which jobs can be placed and which can run, before anything reaches Slurm.

* **Placeable** (:func:`split_placeable`): the planner can give the job GPUs
  on this cluster: its workload is profiled on a usable GPU type it allows,
  ``min_gpus`` can be met and its global batch fits. ``replan`` plans the
  placeable jobs and lets the others wait (a job pinned to a GPU type whose
  nodes are all down must not stop the rest); ``--skip-unplaceable`` does the
  same for ``plan`` and ``submit``.
* **Runnable** (:func:`unrunnable`): ``hetsched run`` has something to run:
  a ``command``, an ``entrypoint``, or a built-in workload whose synthetic
  dataset fits in memory. A converted Gavel job (workload ``resnet-50``, no
  command) would fail on its nodes; a converted ``transformer`` with a
  2.7e9-sample dataset would exhaust the node's memory building it.
* **On the right nodes** (:func:`check_node_types`): each pinned worker's node
  is the partition's and its GPU type is that node's, checked against one ``sinfo``
  (the scripts ask for untyped GPUs on pinned nodes, so Slurm would not refuse a
  wrong type; a node it does not have it refuses only at sbatch, "Invalid node name
  specified", which does not say why: a plan made with another cluster file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import USABLE_STATES, Cluster, Job
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import InputError
from hetsched.slurm.client import NodeInfo

#: the runtime's built-in workloads and the bytes one synthetic sample takes
#: (inputs and label; runtime/workloads.py, checked by tests/slurm/test_runnable.py)
BUILTIN_SAMPLE_BYTES = {"mlp": 64 * 4 + 8, "cnn": 3 * 16 * 16 * 4 + 8,
                        "transformer": 16 * 8 + 8, "tiny-transformer": 16 * 8 + 8,
                        "resnet50": 3 * 64 * 64 * 4 + 8, "bert-base": 128 * 8 + 8}
#: the most memory a built-in's synthetic dataset may take on a node
MAX_BUILTIN_DATASET_BYTES = 4 * 2**30


class UnplaceableError(InputError):
    """Jobs the planner cannot place; the message names them and the option that helps."""


class UnrunnableError(InputError):
    """Jobs that would fail on their nodes; the message names them and why."""


def split_placeable(jobs: Sequence[Job], cluster: Cluster, table: ThroughputTable
                    ) -> tuple[list[Job], list[tuple[Job, str]]]:
    """(placeable jobs, [(job, why not)]): each job checked alone on ``cluster``."""
    ok: list[Job] = []
    bad: list[tuple[Job, str]] = []
    for job in jobs:
        try:
            PlanningProblem([job], cluster, table, jobs_source="plan")
        except InputError as e:
            bad.append((job, e.message))
        else:
            ok.append(job)
    return ok, bad


def why_unrunnable(job: Job) -> str | None:
    """Why ``hetsched run`` would fail for ``job`` on its nodes, or None."""
    if job.command or job.entrypoint:
        return None
    per = BUILTIN_SAMPLE_BYTES.get(job.workload)
    if per is None:
        return (f"workload {job.workload!r} is not a built-in ({', '.join(BUILTIN_SAMPLE_BYTES)}) "
                "and the job has no command or entrypoint")
    need = per * job.dataset_size
    if need > MAX_BUILTIN_DATASET_BYTES:
        return (f"built-in {job.workload!r} would build a synthetic dataset of "
                f"{job.dataset_size:.3g} samples ({need / 2**30:.0f} GiB, more than "
                f"{MAX_BUILTIN_DATASET_BYTES // 2**30} GiB); lower dataset_size or give a "
                "command or entrypoint")
    return None


def unrunnable(plan: Plan, names: set[str] | None = None) -> list[tuple[str, str]]:
    """[(job, why)] for the plan's jobs that would fail where they run."""
    out = []
    for j in plan.jobs:
        if names is not None and j.name not in names:
            continue
        why = "the plan carries no job spec" if j.spec is None else why_unrunnable(j.spec)
        if why:
            out.append((j.name, why))
    return out


def listing(items: Sequence[tuple[str, str]], limit: int = 5) -> str:
    """``a (why); b (why); ... and N more``: one line for an error message."""
    head = "; ".join(f"{n} ({w})" for n, w in items[:limit])
    more = len(items) - limit
    return head + (f"; and {more} more" if more > 0 else "")


def plan_placeable(jobs: list[Job], cluster: Cluster, table: ThroughputTable, *,
                   skip_unplaceable: bool = False, jobs_source: str = "jobs",
                   warn: Callable[[str], None] | None = None, **kwargs: Any) -> Plan:
    """``make_plan``, with ``--skip-unplaceable``: plan the placeable jobs, list the rest.

    The skipped jobs are recorded in the plan (top-level ``skipped_unplaceable``).
    Without the option an unplaceable job is refused and the error names it.
    """
    from hetsched.planning.planner import make_plan  # heavy; only when planning

    skipped: list[tuple[Job, str]] = []
    if skip_unplaceable:
        jobs, skipped = split_placeable(jobs, cluster, table)
        for job, why in skipped:
            if warn is not None:
                warn(f"skipped {job.name}: cannot be placed: {why}")
        if not jobs:
            raise UnplaceableError(jobs_source, "no job can be placed on this cluster: "
                                   + listing([(j.name, w) for j, w in skipped]))
    try:
        plan = make_plan(jobs, cluster, table, jobs_source=jobs_source, **kwargs)
    except InputError as e:
        if e.where and e.where.startswith("job ") and not skip_unplaceable:
            raise UnplaceableError(e.source, e.message + "; pass --skip-unplaceable to plan "
                                   "the other jobs", e.where) from None
        raise
    if skipped:
        plan.notes.skipped_unplaceable = [{"job": j.name, "why": w} for j, w in skipped]
    return plan


def check_node_types(plan: Plan, nodes: Iterable[NodeInfo], names: set[str],
                     pinned: bool = True, partition: str | None = None,
                     source: str = "plan") -> None:
    """Each pinned worker's node is one of ``nodes`` (sinfo's, of ``partition``) and its
    GPU type is that node's, before any sbatch.

    Pinned components ask Slurm for untyped GPUs on their node (templates.py: so
    a replan can move a pending job to another type's node in place), so Slurm
    no longer refuses a plan that names the wrong type for a node: this does.
    Unpinned: nothing to check.
    """
    if not pinned:
        return
    nodes = list(nodes)
    have = {n.name: n.gres for n in nodes}
    for j in plan.jobs:
        if j.name not in names or not j.segments:
            continue
        check_nodes_known([w.node for w in j.segments[0].workers], nodes, partition,
                          f"job {j.name!r}", source)
        for w in j.segments[0].workers:
            types = have.get(w.node)
            if types and w.gpu_type not in types:
                raise InputError(source, f"it has {w.gpu_type} GPUs on node "
                                 f"{w.node}, which Slurm says has "
                                 f"{', '.join(sorted(types))} GPUs; plan again on this "
                                 "partition", f"job {j.name!r}")


def check_nodes_known(used: Iterable[str], nodes: Sequence[NodeInfo], partition: str | None,
                      field: str, source: str = "plan") -> None:
    """InputError naming the first of ``used`` that Slurm's ``nodes`` (of ``partition``)
    lack: the plan was made for another cluster (a cluster file), and sbatch would say
    only "Invalid node name specified". Nothing listed: nothing to compare with."""
    have = {n.name for n in nodes}
    missing = [n for n in dict.fromkeys(used) if n not in have]
    if have and missing:
        where = f"partition {partition}" if partition else "Slurm"
        names = sorted(have)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise InputError(source, f"it runs on node {missing[0]}, which {where} does not have "
                         f"(its nodes: {shown}); plan again "
                         "on this cluster: without --cluster, or with a cluster file that "
                         "names its nodes", field)


def unavailable_nodes(nodes: Iterable[NodeInfo]) -> dict[str, str]:
    """Nodes that start no job now (down, drained, reserved...): name -> state. The
    planner's notion (``core.spec.USABLE_STATES``), which the monitor's ``job-blocked``
    event uses too."""
    return {n.name: n.state for n in nodes if n.state not in USABLE_STATES}


def unavailable_node_note(plan: Plan, nodes: Iterable[NodeInfo], names: set[str],
                          pinned: bool = True) -> str | None:
    """One warning naming the jobs whose first segment the plan places on a node Slurm
    shows down or drained now: they wait until it returns, or until a replan moves them.
    Unpinned jobs go wherever Slurm finds GPUs of their type: nothing to say."""
    if not pinned:
        return None
    bad = unavailable_nodes(nodes)
    hit: dict[str, list[str]] = {}
    for j in plan.jobs:
        if j.name in names and j.segments:
            for node in dict.fromkeys(w.node for w in j.segments[0].workers):
                if node in bad:
                    hit.setdefault(node, []).append(j.name)
    if not hit:
        return None
    where = "; ".join(f"{', '.join(js)} on {node} ({bad[node]})" for node, js in sorted(hit.items()))
    return (f"the plan places jobs on nodes Slurm shows unavailable now: {where}; they wait "
            "until the node returns: `hetsched replan` moves them (or plan again)")


#: folders that are this machine's own, whatever their file system
HOST_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run")


def host_local_files(folder: Path, nodes: Iterable[NodeInfo]) -> str | None:
    """A warning when the job files are in a folder only this machine has (tmpfs, or
    under /tmp or /dev/shm on a local file system) and the jobs run elsewhere: there a
    job finds neither its layout file nor its plan, and its log is written where
    ``status`` cannot read it. None otherwise (a workstation's own Slurm, the testbed)."""
    from hetsched.state.fs import filesystem_type, is_network

    real = os.path.realpath(folder)
    fstype = filesystem_type(real)
    under = next((p for p in HOST_LOCAL if real == p or real.startswith(p + "/")), None)
    if fstype != "tmpfs" and (under is None or is_network(fstype)):
        return None
    remote = sorted(n.name for n in nodes if n.address and not n.runs_here)
    if not remote:
        return None
    what = "a tmpfs" if fstype == "tmpfs" else f"under {under}"
    return (f"the job files are in {folder}, {what} of this machine, and the jobs run on "
            f"other nodes ({', '.join(remote[:3])}{', ...' if len(remote) > 3 else ''}): "
            "they will not find their files there; put the state file on a file system "
            "the nodes share (HETSCHED_STATE, e.g. in your home directory)")


def node_fit_notes(plan: Plan, units: Mapping[str, Any], cpus_of: Mapping[str, int],
                   node_cpus: Mapping[str, int], exclusive: bool,
                   partition: str | None = None) -> list[str]:
    """Where the units submitted ask a node for more than Slurm gives at once (one line
    each; the jobs still run, some later than planned).

    ``units``: name -> ``Unit`` (its ``(job, segment)`` members; a co-location group's
    share their GPUs); ``cpus_of``: unit -> CPU cores per GPU; ``node_cpus``: sinfo's
    cores per node (0: not said); ``exclusive``: the partition gives whole nodes only
    (OverSubscribe=EXCLUSIVE), so units the plan puts on one node at once queue.
    """
    per_node: dict[str, list[tuple[float, float, str, int]]] = {}
    for name, unit in units.items():
        segs = [plan.job(j).segments[k] for j, k in unit.members
                if k < len(plan.job(j).segments)]
        if not segs:
            continue
        gpus: dict[str, int] = {}
        for w in segs[0].workers:  # a group's members share these GPUs
            gpus[w.node] = gpus.get(w.node, 0) + 1
        start, end = min(s.start_s for s in segs), max(s.end_s for s in segs)
        for node, g in gpus.items():
            per_node.setdefault(node, []).append((start, end, name, g))
    where = f"partition {partition}" if partition else "the default partition"
    notes = []
    for node, items in sorted(per_node.items()):
        have = int(node_cpus.get(node, 0))
        worst_cores: tuple[int, list[str]] = (0, [])
        worst_share: list[str] = []
        for start, _end, _, _ in items:  # the load right after each start
            on = [(n, g) for a, b, n, g in items if a <= start < b]
            cores = sum(g * int(cpus_of.get(n, 1)) for n, g in on)
            if cores > worst_cores[0]:
                worst_cores = (cores, sorted(n for n, _ in on))
            if len(on) > len(worst_share):
                worst_share = sorted(n for n, _ in on)
        if have and worst_cores[0] > have and len(worst_cores[1]) > 1:  # one alone: sbatch says
            notes.append(f"node {node} has {have} CPU cores; the plan runs "
                         f"{', '.join(worst_cores[1])} there at once, which ask for "
                         f"{worst_cores[0]} (cpus_per_gpu per GPU): some will wait for cores")
        if exclusive and len(worst_share) > 1:
            notes.append(f"{where} gives whole nodes (OverSubscribe=EXCLUSIVE): the plan runs "
                         f"{', '.join(worst_share)} on node {node} at once; Slurm will run "
                         "them one after another")
    return notes
