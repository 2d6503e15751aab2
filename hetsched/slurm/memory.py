"""An in-memory Slurm for fast tests of submit rollback, plan order and replan decisions.

``MemorySlurm`` implements the :class:`~hetsched.slurm.client.SlurmClient`
protocol over a dict of jobs: ``submit`` reads the script's ``#SBATCH`` lines
(components, GRES, node list, comment, time) and sbatch's ``--dependency``;
:meth:`MemorySlurm.schedule` starts pending jobs whose dependencies ended and
whose GPUs are free, in id order, as Slurm's FIFO-plus-backfill would on an
idle cluster; :meth:`MemorySlurm.finish` ends a job as the test says. Faults
are injected with ``fail_submit_at`` (the n-th ``submit`` fails as sbatch
would), ``on_submit`` (a hook run after each accepted submit, e.g. to send
a signal mid-batch) and ``down`` (slurmctld does not answer: every call
raises SlurmUnavailable, as the CLI client does on squeue's ``errors``).
Every call is logged in ``calls``.

It is a test double *beside* the real testbed tests (tests/slurm/), never
instead of them: it knows nothing of Slurm's real scheduling, limits or
timing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hetsched.slurm.client import FINISHED_STATES, JobInfo, NodeInfo, PartitionInfo
from hetsched.slurm.runner import CommandError, SlurmUnavailable


@dataclass
class _Comp:
    gpu_type: str
    gpus: int
    node: str = ""
    time: str = ""
    running_on: str = ""


@dataclass
class _Job:
    id: str
    name: str
    comment: str
    comps: list[_Comp]
    after: list[str] = field(default_factory=list)
    state: str = "PENDING"
    reason: str = "Priority"
    reason_detail: str = ""
    start: int = 0
    end: int = 0
    restarts: int = 0
    script: str = ""
    args: tuple[str, ...] = ()


@dataclass
class MemorySlurm:
    """A SlurmClient over plain Python state (see module doc)."""

    nodes_spec: Sequence[tuple[str, str, int]] = (("a100-1", "a100", 2), ("v100-1", "v100", 4),
                                                  ("t4-1", "t4", 4))
    fail_submit_at: set[int] = field(default_factory=set)
    on_submit: Callable[[str], None] | None = None
    calls: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    jobs_by_id: dict[str, _Job] = field(default_factory=dict)
    node_state: dict[str, str] = field(default_factory=dict)
    next_id: int = 1000
    clock: Callable[[], float] = time.time
    down: bool = False  #: slurmctld does not answer: every protocol call raises
    #: partition -> MaxTime in minutes (none: unlimited)
    max_time: dict[str, int] = field(default_factory=dict)
    #: partitions that give whole nodes only (OverSubscribe=EXCLUSIVE)
    exclusive: set[str] = field(default_factory=set)
    #: the partition's DefCpuPerGPU: squeue's cpus_per_tres ("gpu:N") of every job
    def_cpu_per_gpu: int | None = None

    # -- the SlurmClient protocol ---------------------------------------------
    def jobs(self) -> list[JobInfo]:
        self.calls.append(("squeue", ()))
        self._answer()
        return [c for j in self.jobs_by_id.values() for c in self._infos(j)]

    def nodes(self, partition: str | None = None) -> list[NodeInfo]:
        self.calls.append(("sinfo", ()))
        self._answer()
        used: dict[str, int] = {}
        for j in self.jobs_by_id.values():
            if j.state == "RUNNING":
                for c in j.comps:
                    used[c.running_on] = used.get(c.running_on, 0) + c.gpus
        out = []
        for n, t, g in self.nodes_spec:
            state = self.node_state.get(n, "idle")
            if state == "idle" and used.get(n):
                state = "mixed" if used[n] < g else "allocated"
            out.append(NodeInfo(n, state, {t: g}, {t: used.get(n, 0)}, ("gpu",), 2 * g))
        return out

    def submit(self, script_path: str | Path, *, extra_args: Sequence[str] = ()) -> str:
        self.calls.append(("sbatch", (str(script_path), *extra_args)))
        self._answer()
        n = sum(1 for c, _ in self.calls if c == "sbatch")
        if n in self.fail_submit_at:
            raise CommandError(["sbatch", "--parsable", str(script_path)], 1,
                               "sbatch: error: Batch job submission failed: injected fault")
        text = Path(script_path).read_text()
        job = self._parse(text, extra_args)
        self.jobs_by_id[job.id] = job
        if self.on_submit is not None:
            self.on_submit(job.id)
        return job.id

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = [str(i) for i in job_ids]
        if ids:
            self.calls.append(("scancel", tuple(ids)))
            self._answer()
        for i in ids:
            j = self.jobs_by_id.get(i)
            if j is not None and j.state not in FINISHED_STATES:
                self._end(j, "CANCELLED", "None")

    def requeue(self, job_ids: Iterable[str]) -> None:
        ids = [str(i) for i in job_ids]
        self.calls.append(("scontrol requeue", tuple(ids)))
        self._answer()
        for i in ids:
            j = self.jobs_by_id[i]
            j.state, j.reason, j.restarts = "PENDING", "BeginTime", j.restarts + 1
            for c in j.comps:
                c.running_on = ""

    def update_dependency(self, job_id: str, dependency: str) -> None:
        """``scontrol update jobid=ID dependency=...`` of a pending job."""
        self.calls.append(("scontrol update", (job_id, f"dependency={dependency}")))
        self._answer()
        j = self.jobs_by_id.get(job_id)
        if j is None:
            raise CommandError(["scontrol", "update"], 1,
                               f"Invalid job id specified for job {job_id}")
        if j.state != "PENDING":  # Slurm 22.05's words (the testbed)
            why = "has already finished" if j.state in FINISHED_STATES else \
                "is no longer pending execution"
            raise CommandError(["scontrol", "update"], 1, f"Job {why} for job {job_id}")
        j.after = _after(dependency)

    def update_job(self, job_id: str, fields: Sequence[str]) -> None:
        """``scontrol update`` of a pending job or component, with Slurm 22.05's limits:
        a hetjob's leader id updates every component and cannot take a node list
        (scontrol: "Job resizing not supported for job arrays"), nor can ``L+K``
        ("Invalid job ID"); a GPU *type* changed by GRES makes the job never
        runnable (BadConstraints)."""
        self.calls.append(("scontrol update", (job_id, *fields)))
        self._answer()
        kv = dict(f.split("=", 1) for f in fields)
        lead, plus, off = job_id.partition("+")
        j = self.jobs_by_id.get(lead) or next(
            (x for x in self.jobs_by_id.values()
             if job_id.isdigit() and len(x.comps) > 1
             and 0 < int(job_id) - int(x.id) < len(x.comps)), None)
        if j is None:
            raise CommandError(["scontrol", "update"], 1, "Invalid job id specified")
        if j.state != "PENDING":
            raise CommandError(["scontrol", "update"], 1, "Job is no longer pending execution")
        het = len(j.comps) > 1
        if "ReqNodeList" in kv and (plus or (het and j.id == job_id)):
            raise CommandError(["scontrol", "update"], 1,
                               f"scontrol: error: Invalid job ID {job_id}" if plus else
                               "scontrol: error: Job resizing not supported for job arrays")
        comps = ([j.comps[int(off)]] if plus else j.comps if j.id == job_id
                 else [j.comps[int(job_id) - int(j.id)]])
        types = {n: t for n, t, _ in self.nodes_spec}
        for c in comps:
            if "ReqNodeList" in kv:
                c.node = kv["ReqNodeList"]
            if "Gres" in kv:
                m = re.match(r"gpu:(?:([^:]+):)?(\d+)$", kv["Gres"])
                if m is None:
                    raise CommandError(["scontrol", "update"], 1, "Invalid generic resource")
                if m.group(1) and m.group(1) != c.gpu_type:
                    j.reason = "BadConstraints"  # Slurm 22.05: never runnable
                c.gpus = int(m.group(2))
            if c.node:
                c.gpu_type = types.get(c.node, c.gpu_type)
            if "TimeLimit" in kv:
                c.time = kv["TimeLimit"]
        if "Comment" in kv:
            j.comment = kv["Comment"]
        if kv.get("StartTime") == "now" and j.reason == "BeginTime":
            j.reason = "Priority"
        if "Dependency" in kv:
            j.after = _after(kv["Dependency"])

    def job_detail(self, job_id: str) -> list[JobInfo]:
        self.calls.append(("scontrol show job", (job_id,)))
        self._answer()
        j = self.jobs_by_id.get(str(job_id))
        return self._infos(j) if j is not None else []

    def version(self) -> str:
        return "22.05.8-memory"

    def partition_info(self, partition: str | None = None) -> PartitionInfo:
        self._answer()
        name = partition or "gpu"
        return PartitionInfo(self.max_time.get(name), name in self.exclusive)

    # -- what a test drives ---------------------------------------------------
    def _answer(self) -> None:
        if self.down:
            raise SlurmUnavailable(["squeue", "--json"], 0, "slurm_load_jobs: Unspecified error",
                                   "is slurmctld up? `scontrol ping` tells")

    def schedule(self) -> list[str]:
        """Start what can start now (dependencies ended, GPUs free); returns the ids."""
        started = []
        for j in sorted(self.jobs_by_id.values(), key=lambda j: int(j.id)):
            if j.state != "PENDING" or j.reason == "BadConstraints":
                continue
            waiting = [a for a in j.after if a in self.jobs_by_id
                       and self.jobs_by_id[a].state not in FINISHED_STATES]
            if waiting:
                j.reason = "Dependency"
                continue
            place = self._place(j)
            if place is None:
                # Slurm 22.05 names a pinned job's node as unavailable also when it
                # is only busy (tests/slurm/test_monitor_replan.py)
                pinned = ",".join(c.node for c in j.comps if c.node)
                j.reason = "ReqNodeNotAvail" if pinned else "Resources"
                j.reason_detail = f"ReqNodeNotAvail, UnavailableNodes:{pinned}" if pinned else ""
                continue
            j.reason_detail = ""
            for c, n in zip(j.comps, place, strict=True):
                c.running_on = n
            j.state, j.reason, j.start = "RUNNING", "None", int(self.clock())
            started.append(j.id)
        return started

    def finish(self, job_id: str, state: str = "COMPLETED", reason: str = "None") -> None:
        self._end(self.jobs_by_id[job_id], state, reason)

    def node_down(self, node: str) -> None:
        """The node goes down: its jobs are requeued (they were submitted --requeue)."""
        self.node_state[node] = "down"
        for j in self.jobs_by_id.values():
            if j.state == "RUNNING" and any(c.running_on == node for c in j.comps):
                self.requeue([j.id])

    def active(self) -> list[str]:
        return [j.id for j in self.jobs_by_id.values() if j.state not in FINISHED_STATES]

    def count(self, command: str) -> int:
        return sum(1 for c, _ in self.calls if c == command)

    # -- internals --------------------------------------------------------------
    def _end(self, j: _Job, state: str, reason: str) -> None:
        j.state, j.reason, j.end = state, reason, int(self.clock())
        for c in j.comps:
            c.running_on = ""

    def _free(self) -> dict[str, int]:
        free = {n: g for n, _, g in self.nodes_spec if self.node_state.get(n, "idle") == "idle"}
        for j in self.jobs_by_id.values():
            if j.state == "RUNNING":
                for c in j.comps:
                    if c.running_on in free:
                        free[c.running_on] -= c.gpus
        return free

    def _place(self, j: _Job) -> list[str] | None:
        free = self._free()
        types = {n: t for n, t, _ in self.nodes_spec}
        out = []
        for c in j.comps:
            cands = [c.node] if c.node else [n for n, t in types.items() if t == c.gpu_type]
            n = next((n for n in cands if free.get(n, 0) >= c.gpus
                      and types.get(n) == c.gpu_type), None)
            if n is None:
                return None
            free[n] -= c.gpus
            out.append(n)
        return out

    def _parse(self, text: str, extra_args: Sequence[str]) -> _Job:
        comps: list[_Comp] = []
        name = comment = ""
        cur = _Comp("", 0)
        for line in text.splitlines():
            if not line.startswith("#SBATCH "):
                continue
            opt = line[len("#SBATCH "):].strip()
            if opt == "hetjob":
                comps.append(cur)
                cur = _Comp("", 0)
                continue
            key, _, val = opt.partition("=")
            if key == "--job-name":
                name = val
            elif key == "--comment":
                comment = val
            elif key == "--gres":
                m = re.match(r"gpu:(?:([^:]+):)?(\d+)$", val)
                if m is None:
                    raise CommandError(["sbatch"], 1, f"sbatch: error: Invalid gres '{val}'")
                cur.gpu_type, cur.gpus = m.group(1) or "", int(m.group(2))
            elif key == "--nodelist":
                cur.node = val
            elif key == "--time":
                cur.time = val
        comps.append(cur)
        types = {n: t for n, t, _ in self.nodes_spec}
        for c in comps:  # untyped GRES on a pinned node: the node's type
            if not c.gpu_type and c.node:
                c.gpu_type = types.get(c.node, "")
        after: list[str] = []
        for a in extra_args:
            if a.startswith("--dependency="):
                after = _after(a.split("=", 1)[1])
        jid = str(self.next_id)
        self.next_id += len(comps)  # hetjob components take the ids after the leader's
        return _Job(jid, name, comment, comps, after=after, script=text, args=tuple(extra_args))

    def _infos(self, j: _Job) -> list[JobInfo]:
        waiting = [a for a in j.after if a in self.jobs_by_id
                   and self.jobs_by_id[a].state not in FINISHED_STATES]
        dep = f"afterany:{':'.join(waiting)}(unfulfilled)" if waiting else ""
        base = JobInfo(job_id=j.id, name=j.name, state=j.state, reason=j.reason,
                       comment=j.comment, restarts=j.restarts, start_time=j.start,
                       end_time=j.end, partition="gpu", dependency=dep,
                       cpus_per_gpu=self.def_cpu_per_gpu)
        base = replace(base, reason_detail=j.reason_detail if j.state == "PENDING" else "")
        if len(j.comps) == 1:
            c = j.comps[0]
            return [replace(base, nodes=c.running_on, gres=f"gpu:{c.gpu_type}:{c.gpus}",
                            required_nodes=c.node)]
        return [replace(base, job_id=str(int(j.id) + k), het_job_id=j.id, het_offset=k,
                        nodes=c.running_on, gres=f"gpu:{c.gpu_type}:{c.gpus}",
                        required_nodes=c.node)
                for k, c in enumerate(j.comps)]


def _after(expr: str) -> list[str]:
    """``afterany:1:2,afterok:3`` -> the ids (the kind does not matter here)."""
    out = []
    for part in re.split(r"[,?]", expr):
        out += [x for x in part.split(":")[1:] if x.isdigit()]
    return out
