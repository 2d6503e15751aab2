"""The SlurmClient protocol and its backends.

``CliSlurmClient`` (the default) calls Slurm's commands through
:class:`~hetsched.slurm.runner.Runner`. JSON output is parsed defensively:
Slurm 22.05 (openapi v0.0.38) gives ``"job_state": "RUNNING"`` and plain
integers, 23.02+ (data_parser) gives ``"job_state": ["RUNNING"]`` and
``{"set": true, "number": 5}`` wrappers; both are accepted.

Read-only status of every job comes from *one* ``squeue --json`` call, so a
monitor cycle costs one command whatever the number of jobs.

Size: the protocol, the CLI backend and the parsers of both squeue/sinfo JSON
layouts belong together: a Slurm version change touches all three at once.

``sacct`` is used only when accounting is enabled; otherwise the details of a
finished job come from ``scontrol show job`` (kept for ``MinJobAge``) and,
once Slurm has forgotten the job, from hetsched's own state store.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hetsched.slurm.runner import SAFE_TRANSIENT, CommandError, Runner, SlurmUnavailable
from hetsched.slurm.sbatch_env import enclosing_job, sbatch_environment

log = logging.getLogger("hetsched.slurm")
#: SBATCH_* variables this process has already said it leaves out (once each)
_told: set[str] = set()

#: Slurm job states after which a job will not run again (unless requeued).
FINISHED_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT", "REVOKED",
})
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                           "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STAGE_OUT",
                           "SIGNALING", "STOPPED", "RESV_DEL_HOLD"})


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job, or one component of a heterogeneous job.

    ``job_id`` is the component's own id; ``het_job_id`` the leader's id (0
    when not a hetjob); ``het_offset`` the component index.
    """

    job_id: str
    name: str
    state: str
    reason: str = ""
    nodes: str = ""
    partition: str = ""
    comment: str = ""
    admin_comment: str = ""
    het_job_id: str = ""
    het_offset: int | None = None
    exit_code: int | None = None
    gres: str = ""
    restarts: int = 0
    start_time: int = 0  # epoch seconds; 0 when not started
    end_time: int = 0  # epoch seconds: the end, or the expected end (time limit)
    dependency: str = ""  # e.g. "afterany:12(unfulfilled)"; "" when none is left
    time_limit_min: int | None = None
    #: squeue's full reason text, e.g. "ReqNodeNotAvail, UnavailableNodes:a100-1"
    reason_detail: str = ""
    required_nodes: str = ""  # the job's --nodelist (hostlist expression), "" when none
    user_id: int | None = None  # the job's owner (None: not said)
    cpus_per_task: int | None = None  # as submitted (None: not said)
    #: cores per GPU Slurm will give (its cpus_per_tres: --cpus-per-gpu, or the
    #: partition's DefCpuPerGPU for a job that asked no --cpus-per-task); None: not said
    cpus_per_gpu: int | None = None

    @property
    def mine(self) -> bool:
        """Whether this process's user owns the job. A tag (``--comment``) is a plan's
        content hash and job name: another user's run of the same plan has the same."""
        return self.user_id is None or self.user_id == os.getuid()

    @property
    def leader(self) -> str:
        """The id users and hetsched know the job by (the hetjob leader's)."""
        return self.het_job_id if self.het_job_id and self.het_job_id != "0" else self.job_id

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class NodeInfo:
    """One node as sinfo reports it."""

    name: str
    state: str  # idle, mixed, allocated, drained, draining, down, completing, ...
    gres: dict[str, int]  # GPU type -> count configured
    gres_used: dict[str, int]  # GPU type -> count allocated
    partitions: tuple[str, ...] = ()
    cpus: int = 0
    reason: str = ""
    #: GPU type (hetsched's lower-case name) -> as Slurm spells it: GRES types are
    #: case-sensitive, so a script must ask for ``gpu:A100:1`` on a site that says A100
    gres_names: dict[str, str] = field(default_factory=dict)
    address: str = ""  # where slurmctld reaches its slurmd ("" when not said)

    @property
    def runs_here(self) -> bool:
        """Whether the node is this machine (the testbed, a workstation's own Slurm)."""
        import socket

        if self.address in ("localhost", "::1") or self.address.startswith("127."):
            return True
        me = socket.gethostname()
        return bool(self.address) and self.address.split(".")[0] == me.split(".")[0]

    @property
    def free_gpus(self) -> dict[str, int]:
        if self.state in ("down", "drained", "draining", "fail", "failing", "unknown",
                          "future", "inval"):
            return {t: 0 for t in self.gres}
        return {t: max(0, n - self.gres_used.get(t, 0)) for t, n in self.gres.items()}


@runtime_checkable
class SlurmClient(Protocol):
    """What hetsched needs from Slurm. Every method may raise CommandError."""

    def jobs(self) -> list[JobInfo]:
        """All jobs Slurm still knows (one call): the monitor's only status query."""
        ...

    def nodes(self, partition: str | None = None) -> list[NodeInfo]:
        """Nodes of ``partition`` (all when None) with state and GPU use."""
        ...

    def submit(self, script_path: str | Path, *, extra_args: Sequence[str] = ()) -> str:
        """``sbatch --parsable`` a script file; returns the (leader) job id."""
        ...

    def partition_info(self, partition: str | None = None) -> PartitionInfo:
        """The partition's limits (the default partition's for None)."""
        ...

    def cancel(self, job_ids: Iterable[str]) -> None:
        """Cancel jobs (all in one call); unknown ids are not an error."""
        ...

    def requeue(self, job_ids: Iterable[str]) -> None:
        """Requeue running jobs (they restart from their checkpoint)."""
        ...

    def job_detail(self, job_id: str) -> list[JobInfo]:
        """Components of one job, also after it ended ([] when Slurm forgot it)."""
        ...

    def update_dependency(self, job_id: str, dependency: str) -> None:
        """Change a pending job's ``--dependency`` in place ('' clears it)."""
        ...

    def update_job(self, job_id: str, fields: Sequence[str]) -> None:
        """``scontrol update jobid=ID KEY=VALUE...`` of a pending job (or component:
        ``LEADER+OFFSET``, or the component's own id)."""
        ...

    def version(self) -> str:
        """Slurm's version, e.g. ``22.05.8``."""
        ...


# ---------------------------------------------------------------------------
# defensive JSON helpers (22.05 vs 23.02+)


def _num(v: Any) -> int | None:
    """Plain int, or 23.02's ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(v, Mapping):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(_str(x) for x in v)
    if isinstance(v, Mapping):  # e.g. 23.02 "nodes" objects
        return _str(v.get("name") or v.get("nodes") or "")
    return str(v)


def _states(v: Any) -> list[str]:
    if isinstance(v, list):
        return [str(x).upper() for x in v]
    if isinstance(v, str) and v:
        return [s.upper() for s in re.split(r"[+,]", v) if s]
    return []


_GRES_RE = re.compile(r"gpu:([A-Za-z0-9_.-]+):(\d+)")
_UNTYPED_RE = re.compile(r"gpu:(\d+)")


def _gres_items(text: str) -> list[str]:
    """The comma-separated items of a GRES string (commas inside ``(S:0,1)`` kept)."""
    return [item.strip() for item in re.split(r",(?![^()]*\))", text or "")]


#: hetsched's name for GPUs Slurm gives no type (``gpu:4``)
UNTYPED = "gpu"


def gres_names(text: str) -> dict[str, str]:
    """``gpu:A100:2,gpu:t4:1,gpu:4`` -> {"a100": "A100", "t4": "t4", "gpu": ""}: each type
    as Slurm spells it ("" for untyped GPUs: asked for as ``gpu:N``)."""
    out: dict[str, str] = {}
    for item in _gres_items(text):
        m = _GRES_RE.match(item)
        if m:
            out.setdefault(m.group(1).lower(), m.group(1))
        elif _UNTYPED_RE.match(item):
            out.setdefault(UNTYPED, "")
    return out


@dataclass(frozen=True)
class PartitionInfo:
    """What a partition allows: MaxTime in minutes (None: none), and whether it gives
    whole nodes only (``OverSubscribe=EXCLUSIVE``: jobs never share a node)."""

    max_time_min: int | None = None
    exclusive: bool = False


def parse_partition_info(sinfo_out: str, partition: str | None) -> PartitionInfo:
    """From ``sinfo -h -o "%P|%l|%h"`` lines (``gpu*|1-00:00:00|EXCLUSIVE``); the
    default partition (``*``) when ``partition`` is None; no limits when not listed."""
    from hetsched.core.sbatch import time_minutes

    for line in sinfo_out.splitlines():
        name, _, rest = line.strip().partition("|")
        limit, _, share = rest.partition("|")
        if (name.rstrip("*") == partition) if partition else name.endswith("*"):
            try:
                top: int | None = time_minutes(limit.strip())
            except ValueError:  # "infinite", "n/a"
                top = None
            return PartitionInfo(top, share.strip().upper() == "EXCLUSIVE")
    return PartitionInfo()


def type_names(nodes: Iterable[NodeInfo]) -> dict[str, str]:
    """Each GPU type of ``nodes`` -> as Slurm spells it (for ``--gres=gpu:TYPE:N``)."""
    out: dict[str, str] = {}
    for n in nodes:
        for low, spelled in n.gres_names.items():
            out.setdefault(low, spelled)
    return out


def parse_gres(text: str) -> dict[str, int]:
    """``gpu:a100:2(S:0-1),gpu:t4:1`` -> {"a100": 2, "t4": 1}; untyped GPUs are "gpu".

    hetsched names GPU types in lower case; :func:`gres_names` keeps Slurm's spelling.
    """
    out: dict[str, int] = {}
    for item in _gres_items(text):
        m = _GRES_RE.match(item)
        if m:
            out[m.group(1).lower()] = out.get(m.group(1).lower(), 0) + int(m.group(2))
            continue
        m2 = _UNTYPED_RE.match(item)
        if m2:
            out[UNTYPED] = out.get(UNTYPED, 0) + int(m2.group(1))
    return out


def _wait_status(v: int | None) -> int | None:
    """A raw wait status as a shell reports it: the exit code, or 128 + the signal."""
    if v is None or v < 0:
        return v
    return 128 + (v & 0x7F) if v & 0x7F else (v >> 8) & 0xFF


def parse_job_json(j: Mapping[str, Any]) -> JobInfo:
    """One element of ``squeue --json``'s ``jobs`` list, either layout."""
    states = _states(j.get("job_state"))
    het = _num(j.get("het_job_id"))
    off = _num(j.get("het_job_offset"))
    exit_code = j.get("exit_code")
    if isinstance(exit_code, Mapping):  # 23.02: {"status": [..], "return_code": {...}}
        exit_code = _num(exit_code.get("return_code"))
    else:  # 21.08-22.05: the raw wait status (exit 2 is 512; `scontrol` says "2:0")
        exit_code = _wait_status(_num(exit_code))
    gres = _str(j.get("tres_per_node")) or _str(j.get("gres_detail"))
    return JobInfo(
        job_id=str(_num(j.get("job_id")) or ""),
        name=_str(j.get("name")),
        state=states[0] if states else "UNKNOWN",
        reason=_str(j.get("state_reason")),
        nodes=_str(j.get("nodes")),
        partition=_str(j.get("partition")),
        comment=_str(j.get("comment")),
        admin_comment=_str(j.get("admin_comment")),
        het_job_id=str(het) if het else "",
        het_offset=off if het else None,
        exit_code=exit_code,
        gres=gres,
        restarts=_num(j.get("restart_cnt")) or 0,
        start_time=_num(j.get("start_time")) or 0,
        end_time=_num(j.get("end_time")) or 0,
        dependency=_str(j.get("dependency")) if _str(j.get("dependency")) != "(null)" else "",
        time_limit_min=_num(j.get("time_limit")),
        reason_detail=_str(j.get("state_description")),
        required_nodes=_str(j.get("required_nodes")),
        user_id=_num(j.get("user_id")),
        cpus_per_task=_num(j.get("cpus_per_task")),
        cpus_per_gpu=_cpus_per_gpu(j.get("cpus_per_tres")),
    )


def _cpus_per_gpu(tres: Any) -> int | None:
    """``cpus_per_tres`` ("gpu:8": --cpus-per-gpu, or the partition's DefCpuPerGPU) -> 8."""
    m = re.search(r"(?:^|,)(?:gres/)?gpu:(\d+)", _str(tres))
    return int(m.group(1)) if m else None


_NODE_STATE_FLAGS = ("DRAIN", "NOT_RESPONDING", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED")


def node_state(base: Any, flags: Any) -> str:
    """Reduce Slurm's base state + flags to one word the planner understands.

    A drained or not-responding node must not count as usable, whatever its
    base state: that is what keeps ``Cluster.gpus`` honest.
    """
    states = _states(base) + _states(flags)
    s = set(states)
    if "DOWN" in s or "NOT_RESPONDING" in s:
        return "down"
    if "FAIL" in s:
        return "fail"
    if "DRAIN" in s:
        return "drained" if ("IDLE" in s or "DOWN" in s) else "draining"
    for word in ("MIXED", "ALLOCATED", "IDLE", "COMPLETING", "FUTURE", "UNKNOWN", "PLANNED"):
        if word in s:
            return word.lower() if word != "UNKNOWN" else "unknown"
    return (states[0].lower() if states else "unknown")


def parse_node_json(n: Mapping[str, Any]) -> NodeInfo:
    """One element of the ``nodes`` list of ``sinfo --json`` (22.05, 23.02) or
    ``scontrol show nodes --json`` (23.11 on): the same node records."""
    return NodeInfo(
        name=_str(n.get("name") or n.get("hostname")),
        state=node_state(n.get("state"), n.get("state_flags")),
        gres=parse_gres(_str(n.get("gres"))),
        gres_used=parse_gres(_str(n.get("gres_used"))),
        partitions=tuple(str(p) for p in (n.get("partitions") or [])),
        cpus=_num(n.get("cpus")) or 0,
        reason=_str(n.get("reason")),
        gres_names=gres_names(_str(n.get("gres"))),
        address=_str(n.get("address") or n.get("hostname")),
    )


def json_errors(data: Any) -> list[str]:
    """The ``errors`` of a ``--json`` output as text, [] when it has none.

    22.05: ``{"description", "error_number", "error", "source"}`` or
    ``{"error", "errno"}``; 23.02+: ``{"description", "error_number",
    "error", "source"}``. A plain string is kept as it is.
    """
    raw = data.get("errors") if isinstance(data, Mapping) else None
    out: list[str] = []
    for e in raw if isinstance(raw, list) else []:
        if isinstance(e, Mapping):
            parts = [_str(e.get(k)) for k in ("source", "description", "error")]
            text = ": ".join(dict.fromkeys(p for p in parts if p))
            out.append(text or json.dumps(dict(e), sort_keys=True))
        elif e:
            out.append(str(e))
    return out


def parse_scontrol_records(text: str) -> list[dict[str, str]]:
    """``scontrol show job --oneliner`` output -> one dict per record."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        rec: dict[str, str] = {}
        # values never contain "=" followed by a key, but may contain spaces
        # (e.g. Comment=a b); split on " Key=" boundaries
        for m in re.finditer(r"(?:^|\s)([A-Za-z/:_]+)=(.*?)(?=\s[A-Za-z/:_]+=|$)", line):
            rec[m.group(1)] = m.group(2)
        records.append(rec)
    return records


# ---------------------------------------------------------------------------


def _listed(data: Mapping[str, Any], key: str, argv: list[str]) -> list[Any]:
    """The list under ``key`` of a ``--json`` document, or a CommandError naming the command."""
    items = data.get(key)
    if not isinstance(items, list):
        raise CommandError(argv, 0, "", f"{' '.join(argv)}: no {key!r} list in the output")
    return items


def _tell_left_out(left_out: Mapping[str, str]) -> None:
    """Warn once per process about each SBATCH_* variable sbatch does not get."""
    job = enclosing_job(os.environ)
    if job and "SLURM_JOB_ID" not in _told:
        _told.add("SLURM_JOB_ID")
        log.info("running inside Slurm job %s: its SLURM_* variables are not passed to "
                 "the jobs submitted", job)
    for var, why in sorted(left_out.items()):
        if var not in _told:
            _told.add(var)
            log.warning("%s in the environment is not passed to sbatch: %s", var, why)


@dataclass
class CliSlurmClient:
    """SlurmClient backed by the Slurm command-line tools."""

    runner: Runner = field(default_factory=Runner)
    _accounting: bool | None = None
    _version: str | None = None

    def _json_list(self, argv: list[str], key: str) -> list[Any]:
        """Run a ``--json`` command and return the list under ``key``, or say what was wrong."""
        return _listed(self._json(argv), key, argv)

    def _json(self, argv: list[str]) -> Mapping[str, Any]:
        """Run a ``--json`` command and return its document, or say what was wrong.

        Slurm 22.05 exits 0 with an empty list and an ``errors`` list when
        slurmctld does not answer: that is no answer, never "no jobs" or "no
        nodes" (SlurmUnavailable).
        """
        res = self.runner.run(argv)
        try:
            data = json.loads(res.stdout)
        except ValueError:
            raise CommandError(res.argv, 0, res.stdout[:200],
                               f"{' '.join(argv)} did not print JSON") from None
        errors = json_errors(data)
        if errors:
            raise SlurmUnavailable(res.argv, 0, "; ".join(errors) + (
                f" {res.stderr.strip()}" if res.stderr.strip() else ""),
                "is slurmctld up? `scontrol ping` tells")
        if not isinstance(data, Mapping):
            raise CommandError(res.argv, 0, "", f"{' '.join(argv)} did not print a JSON object")
        return data

    def jobs(self) -> list[JobInfo]:
        # squeue --json in 22.05 lists all jobs, finished ones included, and
        # ignores most filters: filter here.
        jobs = self._json_list(["squeue", "--json"], "jobs")
        return [parse_job_json(j) for j in jobs if isinstance(j, Mapping)]

    def nodes(self, partition: str | None = None) -> list[NodeInfo]:
        argv = ["sinfo", "--json"]
        data = self._json(argv)
        if not isinstance(data.get("nodes"), list) and isinstance(data.get("sinfo"), list):
            # 23.11 on: `sinfo --json` lists sinfo's groups of nodes (a group's GRES in
            # use is not each node's); `scontrol show nodes --json` lists the nodes
            argv = ["scontrol", "show", "nodes", "--json"]
            data = self._json(argv)
        nodes = _listed(data, "nodes", argv)
        out = [parse_node_json(n) for n in nodes if isinstance(n, Mapping)]
        if partition:
            out = [n for n in out if partition in n.partitions]
        return out

    def partition_info(self, partition: str | None = None) -> PartitionInfo:
        res = self.runner.run(["sinfo", "-h", "-o", "%P|%l|%h"])
        return parse_partition_info(res.stdout, partition)

    def partitions(self) -> list[str]:
        """Partition names (default first)."""
        res = self.runner.run(["sinfo", "-h", "-o", "%P"])
        names = [p.strip() for p in res.stdout.split() if p.strip()]
        names.sort(key=lambda p: 0 if p.endswith("*") else 1)
        return [p.rstrip("*") for p in names]

    def submit(self, script_path: str | Path, *, extra_args: Sequence[str] = ()) -> str:
        # the script decides, not the caller's environment (sbatch_env.py): an
        # enclosing job's SLURM_* and a shell's overriding SBATCH_* stay out
        env, left_out = sbatch_environment(os.environ, Path(script_path).read_text(
            encoding="utf-8", errors="replace"))
        _tell_left_out(left_out)
        # only retry when the controller was never reached: a lost reply to a
        # successful sbatch must not become a second job (the caller checks).
        res = self.runner.run(["sbatch", "--parsable", *extra_args, str(script_path)],
                              retry_on=SAFE_TRANSIENT, environ=env)
        first = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        job_id = first.split(";")[0].strip()
        if not job_id.isdigit():
            raise CommandError(res.argv, 0, res.stderr or res.stdout,
                               "sbatch --parsable printed no job id")
        return job_id

    def cancel(self, job_ids: Iterable[str]) -> None:
        ids = [str(i) for i in job_ids]
        if not ids:
            return
        try:  # an unreachable controller is retried, then SlurmUnavailable
            self.runner.run(["scancel", *ids])
        except SlurmUnavailable:
            raise
        except CommandError as e:
            if "Invalid job id" not in e.stderr:
                raise

    def requeue(self, job_ids: Iterable[str]) -> None:
        ids = [str(i) for i in job_ids]
        if ids:
            self.runner.run(["scontrol", "requeue", ",".join(ids)])

    def update_dependency(self, job_id: str, dependency: str) -> None:
        # a pending job keeps its id and queue age; '' clears the dependency
        self.runner.run(["scontrol", "update", f"jobid={job_id}",
                         f"dependency={dependency}"])

    def update_job(self, job_id: str, fields: Sequence[str]) -> None:
        # argument list, never a shell; values are validated names and numbers
        self.runner.run(["scontrol", "update", f"jobid={job_id}", *fields])

    def accounting_enabled(self) -> bool:
        """Whether sacct can answer (AccountingStorageType is not ``none``)."""
        if self._accounting is None:
            cfg = self.config()
            self._accounting = cfg.get("AccountingStorageType", "accounting_storage/none") \
                != "accounting_storage/none"
        return self._accounting

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict."""
        res = self.runner.run(["scontrol", "show", "config"])
        cfg: dict[str, str] = {}
        for line in res.stdout.splitlines():
            if " = " in line:
                k, _, v = line.partition(" = ")
                cfg[k.strip()] = v.strip()
        return cfg

    def job_detail(self, job_id: str) -> list[JobInfo]:
        if self.accounting_enabled():
            res = self.runner.run(["sacct", "-j", str(job_id), "-X", "-P", "-n",
                                   "-o", "JobID,JobName,State,ExitCode,NodeList,Partition"],
                                  check=False)
            if res.returncode == 0 and res.stdout.strip():
                out = []
                for line in res.stdout.strip().splitlines():
                    jid, name, state, code, nodes, part = (line.split("|") + [""] * 6)[:6]
                    leader, _, off = jid.partition("+")
                    out.append(JobInfo(
                        job_id=jid, name=name, state=(state.split() or ["UNKNOWN"])[0],
                        nodes=nodes, partition=part, het_job_id=leader if off else "",
                        het_offset=int(off) if off.isdigit() else None,
                        exit_code=int(code.split(":")[0]) if code[:1].isdigit() else None))
                return out
        try:  # an unreachable controller is retried, then SlurmUnavailable
            res = self.runner.run(["scontrol", "show", "job", "--oneliner", str(job_id)])
        except SlurmUnavailable:
            raise
        except CommandError as e:
            if "Invalid job id" in e.stderr:
                return []
            raise
        out = []
        for r in parse_scontrol_records(res.stdout):
            code = r.get("ExitCode", "")
            out.append(JobInfo(
                job_id=r.get("JobId", ""), name=r.get("JobName", ""),
                state=r.get("JobState", "UNKNOWN"), reason=r.get("Reason", ""),
                nodes=r.get("NodeList", "") if r.get("NodeList") != "(null)" else "",
                partition=r.get("Partition", ""), comment=r.get("Comment", ""),
                het_job_id=r.get("HetJobId", ""),
                het_offset=int(r["HetJobOffset"]) if r.get("HetJobOffset", "").isdigit()
                else None,
                exit_code=int(code.split(":")[0]) if code[:1].isdigit() else None,
                gres=r.get("TresPerNode", ""),
                restarts=int(r["Restarts"]) if r.get("Restarts", "").isdigit() else 0))
        return out

    def version(self) -> str:
        if self._version is None:
            res = self.runner.run(["sinfo", "--version"])
            m = re.search(r"(\d+\.\d+(?:\.\d+)?)", res.stdout)
            self._version = m.group(1) if m else res.stdout.strip()
        return self._version

    def ping(self) -> bool:
        """Whether slurmctld answers right now (no retries)."""
        res = self.runner.run(["scontrol", "ping"], check=False, retries=0)
        return res.returncode == 0 and "UP" in res.stdout


# ---------------------------------------------------------------------------
# optional pyslurm backend (reads only)


def pyslurm_status(slurm_version: str) -> tuple[bool, str]:
    """Whether an installed pyslurm can be used for reads, and why (not).

    pyslurm's major.minor must equal the cluster's Slurm major.minor: it is
    compiled against one Slurm ABI. No pyslurm release can submit a
    heterogeneous job, so writes always go through the CLI.
    """
    try:
        import pyslurm
    except ImportError:
        return False, ("pyslurm is not installed; using the Slurm CLI (PyPI only has pyslurm "
                       "25.11.x, which needs Slurm 25.11 headers, and old 17/18 releases)")
    except Exception as e:  # a pyslurm built for another Slurm fails to load its .so
        return False, f"pyslurm is installed but does not load ({e}); using the Slurm CLI"
    pv = str(getattr(pyslurm, "__version__", "") or getattr(pyslurm, "version", lambda: "")())
    want = ".".join(slurm_version.split(".")[:2])
    have = ".".join(pv.split(".")[:2])
    if not have or have != want:
        return False, (f"pyslurm {pv or '(unknown version)'} does not match Slurm "
                       f"{slurm_version}; using the Slurm CLI")
    if not hasattr(pyslurm, "Jobs") or not hasattr(pyslurm, "Nodes"):
        return False, f"pyslurm {pv} lacks the Jobs/Nodes API (needs >= 23.2); using the CLI"
    return True, f"pyslurm {pv} matches Slurm {slurm_version}; used for reads"


@dataclass
class PyslurmReadClient(CliSlurmClient):
    """Reads via pyslurm (>= 23.2 API), writes via the CLI.

    Only chosen by :func:`make_client` when :func:`pyslurm_status` says the
    versions match; not exercised on the 22.05 testbed (no pyslurm builds
    against 22.05).
    """

    def jobs(self) -> list[JobInfo]:  # pragma: no cover - needs a matching pyslurm
        import pyslurm

        out = []
        for j in pyslurm.Jobs.load().values():
            out.append(JobInfo(
                job_id=str(j.id), name=str(j.name or ""), state=str(j.state or "UNKNOWN"),
                reason=str(j.state_reason or ""), nodes=str(j.nodes or ""),
                partition=str(j.partition or ""), comment=str(j.comment or ""),
                admin_comment=str(getattr(j, "admin_comment", "") or ""),
                het_job_id=str(j.het_job_id or ""),
                het_offset=j.het_job_offset if j.het_job_id else None,
                exit_code=getattr(j, "exit_code", None)))
        return out


def make_client(runner: Runner | None = None, backend: str = "cli") -> tuple[CliSlurmClient, str]:
    """The client to use and a one-line note saying which backend and why.

    ``backend``: ``cli`` (default), ``pyslurm`` (reads via pyslurm when it
    matches, else the CLI with the reason), or ``auto`` (same as pyslurm).
    """
    cli = CliSlurmClient(runner or Runner())
    if backend == "cli":
        return cli, "backend: Slurm CLI"
    ok, why = pyslurm_status(cli.version())
    if ok:
        return PyslurmReadClient(cli.runner), why
    return cli, why
