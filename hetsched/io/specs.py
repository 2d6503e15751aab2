"""Reading job specs and cluster descriptions from YAML, with one-line errors.

Every loader raises :class:`~hetsched.errors.InputError` naming the file, the
job or field, and what would be valid.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import hostlist

from hetsched.core import limits
from hetsched.core.efficiency import PRIOR_EPOCHS
from hetsched.core.sbatch import SbatchOptionError, SbatchOptions
from hetsched.core.spec import (
    ENTRYPOINT_RE,
    GPU_TYPE_RE,
    LR_SCALINGS,
    NAME_RE,
    NODE_STATES,
    WORKLOAD_RE,
    WORKLOAD_VALID,
    Cluster,
    Elastic,
    Job,
    Node,
)
from hetsched.errors import InputError
from hetsched.io.yamlfile import read_yaml

__all__ = ["read_yaml", "load_jobs", "load_cluster", "parse_job", "parse_jobs",
           "parse_cluster"]


_EXP_NUMBER = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]{1,4}$")


class _Fields:
    """Typed access to one mapping of a spec file, with precise errors."""

    def __init__(self, data: Any, source: str, where: str, known: Sequence[str]) -> None:
        if not isinstance(data, Mapping):
            raise InputError(source, f"expected a mapping, got {type(data).__name__}", where)
        unknown = sorted(set(map(str, data)) - set(known))
        if unknown:
            raise InputError(
                source,
                f"unknown field {unknown[0]!r}; valid fields: {', '.join(known)}",
                where,
            )
        self.data = data
        self.source = source
        self.where = where

    def _err(self, key: str, msg: str) -> InputError:
        return InputError(self.source, msg, f"{self.where}: {key}")

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def str_(self, key: str, default: str | None = None, pattern: re.Pattern[str] | None = None,
             valid: str = "") -> str:
        if not self.has(key):
            if default is not None:
                return default
            raise self._err(key, "missing required field")
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise self._err(key, f"expected a string, got {type(v).__name__}")
        if isinstance(v, int) and abs(v) >= 10**limits.MAX_INT_DIGITS:
            raise self._err(key, "expected a string, got a very long number")
        s = str(v)
        if len(s) > limits.MAX_STRING:
            raise self._err(key, f"{len(s)} characters; the limit is {limits.MAX_STRING}")
        if pattern is not None and not pattern.match(s):
            shown = repr(s) if len(s) <= 80 else f"{s[:60]!r}... ({len(s)} characters)"
            raise self._err(key, f"{shown} is not valid; expected {valid or pattern.pattern}")
        return s

    def num(self, key: str, bound: limits.Bound, default: float | None = None) -> float:
        """A number within ``bound`` (core/limits.py), or the default when absent."""
        if not self.has(key):
            if default is not None:
                return default
            raise self._err(key, "missing required field")
        v = self.data[key]
        if isinstance(v, str) and _EXP_NUMBER.match(v.strip()):
            v = float(v)  # YAML 1.1 reads 1e6 (no dot, no exponent sign) as a string
        msg = limits.check_number(v, bound)
        if msg:
            raise self._err(key, msg)
        return float(v)

    def int_(self, key: str, bound: limits.Bound, default: int | None = None) -> int:
        return int(self.num(key, bound, None if default is None else float(default)))


JOB_FIELDS = (
    "name", "workload", "dataset_size", "epochs", "global_batch", "weight", "arrival_s",
    "model_size_mb", "min_gpus", "max_gpus", "gpu_types", "requested_gpus", "command",
    "entrypoint", "workdir", "memory_gb", "slurm", "elastic", "target_loss",
    "epochs_predicted",
)
ELASTIC_FIELDS = ("min_batch", "max_batch", "lr_scaling", "noise_scale")
NOISE_SCALE = limits.Bound(0, 1e12)
TARGET_LOSS = limits.Bound(-1e12, 1e12)


def _workdir(f: _Fields, base_dir: Path | None, runs_code: bool) -> str | None:
    """The job's absolute working directory: ``~`` expanded, a relative one against
    ``base_dir``; none given, ``base_dir`` for a job that runs code of its own."""
    if not f.has("workdir"):
        return os.path.normpath(base_dir) if runs_code and base_dir is not None else None
    raw = f.str_("workdir")
    if any(ord(c) < 32 for c in raw):
        raise f._err("workdir", "contains a control character")
    p = os.path.expanduser(raw)
    if not os.path.isabs(p):
        if base_dir is None:
            raise f._err("workdir", f"{raw!r} is relative and these jobs come from no file; "
                         "give an absolute path")
        p = os.path.join(base_dir, p)
    return os.path.normpath(p)


def parse_job(data: Any, source: str, index: int, base_dir: Path | None = None) -> Job:
    """Validate one job mapping from a jobs file.

    ``base_dir``: the jobs file's directory (absolute). A relative ``workdir`` is
    taken from it, and a job that runs user code (``command`` or ``entrypoint``)
    with no ``workdir`` runs there.
    """
    name_hint = data.get("name") if isinstance(data, Mapping) else None
    where = (f"job {name_hint!r}" if isinstance(name_hint, str) and len(name_hint) <= 256
             else f"jobs[{index}]")
    f = _Fields(data, source, where, JOB_FIELDS)
    name = f.str_("name", pattern=NAME_RE, valid="ASCII letters, digits, '.', '_' or '-'")
    workload = f.str_("workload", pattern=WORKLOAD_RE, valid=WORKLOAD_VALID)
    b = limits.JOB
    dataset_size = f.int_("dataset_size", b["dataset_size"])
    target_loss = f.num("target_loss", TARGET_LOSS) if f.has("target_loss") else None
    predicted = bool(f.has("epochs_predicted") and data["epochs_predicted"])
    if target_loss is not None and not f.has("epochs"):
        # trained until the loss is reached: the length is a prediction
        # (docs/elastic.md); the ones policy refines it from completed jobs
        epochs, predicted = PRIOR_EPOCHS, True
    else:
        epochs = f.num("epochs", b["epochs"])
    global_batch = f.int_("global_batch", b["global_batch"])
    elastic = _elastic(data.get("elastic"), source, where, global_batch) \
        if f.has("elastic") else None
    weight = f.num("weight", b["weight"], 1.0)
    arrival_s = f.num("arrival_s", b["arrival_s"], 0.0)
    model_size_mb = f.num("model_size_mb", b["model_size_mb"], 0.0)
    min_gpus = f.int_("min_gpus", b["min_gpus"], 1)
    max_gpus = f.int_("max_gpus", b["max_gpus"]) if f.has("max_gpus") else None
    if max_gpus is not None and max_gpus < min_gpus:
        raise f._err("max_gpus", f"must be >= min_gpus ({min_gpus}), got {max_gpus}")
    requested = f.int_("requested_gpus", b["requested_gpus"]) if f.has("requested_gpus") else None
    gpu_types: tuple[str, ...] | None = None
    if f.has("gpu_types"):
        raw = data["gpu_types"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(
                isinstance(t, str) and GPU_TYPE_RE.match(t) for t in raw):
            raise f._err("gpu_types", "expected a non-empty list of GPU type names")
        gpu_types = tuple(t.lower() for t in raw)
    command: tuple[str, ...] | None = None
    if f.has("command"):
        raw = data["command"]
        if isinstance(raw, str):
            try:
                argv = shlex.split(raw)
            except ValueError as e:
                raise f._err("command", f"cannot split into arguments: {e}") from None
        elif isinstance(raw, list) and all(isinstance(a, (str, int, float)) for a in raw):
            argv = [str(a) for a in raw]
        else:
            raise f._err("command", "expected a string or a list of arguments")
        if not argv:
            raise f._err("command", "must not be empty")
        if len(argv) > limits.MAX_COMMAND_ARGS or any(len(a) > limits.MAX_STRING for a in argv):
            raise f._err("command", f"too long; the limit is {limits.MAX_COMMAND_ARGS} "
                         f"arguments of {limits.MAX_STRING} characters")
        command = tuple(argv)
    entrypoint = None
    if f.has("entrypoint"):
        entrypoint = f.str_("entrypoint", pattern=ENTRYPOINT_RE, valid="'module.path:function'")
    if command is not None and entrypoint is not None:
        raise InputError(source, "give either 'command' or 'entrypoint', not both", where)
    workdir = _workdir(f, base_dir, command is not None or entrypoint is not None)
    memory_gb = f.num("memory_gb", b["memory_gb"]) if f.has("memory_gb") else None
    slurm = parse_sbatch(data["slurm"], source, f"{where}.slurm") if f.has("slurm") else None
    try:
        return Job(
            name=name, workload=workload, dataset_size=dataset_size, epochs=epochs,
            global_batch=global_batch, weight=weight, arrival_s=arrival_s,
            model_size_mb=model_size_mb, min_gpus=min_gpus, max_gpus=max_gpus,
            gpu_types=gpu_types, requested_gpus=requested, command=command,
            entrypoint=entrypoint, workdir=workdir, memory_gb=memory_gb, slurm=slurm,
            elastic=elastic, target_loss=target_loss, epochs_predicted=predicted,
        )
    except InputError as e:  # Job's own checks: name this file, not "Job"
        raise InputError(source, e.message, e.where) from None


def parse_sbatch(data: Any, source: str, where: str) -> SbatchOptions:
    """A ``slurm:`` mapping (a job's, or the jobs file's default for every job)."""
    if not isinstance(data, Mapping):
        raise InputError(source, f"expected a mapping, got {type(data).__name__}", where)
    try:
        return SbatchOptions.parse(data)
    except SbatchOptionError as e:
        raise InputError(source, str(e), f"{where}.{e.key}") from None


def _elastic(raw: Any, source: str, where: str, global_batch: int) -> Elastic:
    """``elastic: {min_batch, max_batch, lr_scaling}``; the user's batch must lie inside."""
    e = _Fields(raw, source, f"{where}: elastic", ELASTIC_FIELDS)
    gb = limits.JOB["global_batch"]
    lo = e.int_("min_batch", gb, global_batch)
    hi = e.int_("max_batch", gb, global_batch)
    rule = e.str_("lr_scaling", "linear")
    if rule not in LR_SCALINGS:
        raise e._err("lr_scaling", f"{rule!r} is not valid; expected {', '.join(LR_SCALINGS)}")
    if not lo <= global_batch <= hi:
        raise InputError(source, f"min_batch {lo} <= global_batch {global_batch} <= max_batch "
                         f"{hi} does not hold", f"{where}: elastic")
    noise = e.num("noise_scale", NOISE_SCALE) if e.has("noise_scale") else None
    return Elastic(lo, hi, rule, noise)


def parse_jobs(data: Any, source: str, base_dir: Path | None = None) -> list[Job]:
    """Validate a whole jobs document: ``{jobs: [...], slurm: {...}}`` or a bare list.

    A top-level ``slurm:`` mapping is every job's default (a job's own keys win).
    ``base_dir``: the jobs file's directory (:func:`parse_job`); None for jobs that
    come from no file.
    """
    default: SbatchOptions | None = None
    if isinstance(data, Mapping):
        unknown = sorted(set(map(str, data)) - {"jobs", "slurm"})
        if unknown:
            raise InputError(source, f"unknown top-level key {unknown[0]!r}; expected 'jobs' "
                             "(and optionally 'slurm')")
        if data.get("slurm") is not None:
            default = parse_sbatch(data["slurm"], source, "slurm")
        data = data.get("jobs")
    if data is None:
        raise InputError(source, "no jobs: expected a list under 'jobs:'")
    if not isinstance(data, list):
        raise InputError(source, f"'jobs' must be a list, got {type(data).__name__}")
    if not data:
        raise InputError(source, "no jobs: the 'jobs' list is empty")
    too_many = limits.check_size("jobs", len(data), limits.MAX_JOBS)
    if too_many:
        raise InputError(source, too_many, "jobs")
    jobs = [parse_job(item, source, i, base_dir) for i, item in enumerate(data)]
    if default:
        jobs = [replace(j, slurm=(j.slurm or SbatchOptions()).over(default)) for j in jobs]
    seen: set[str] = set()
    for j in jobs:
        if j.name in seen:
            raise InputError(source, "duplicate job name; names must be unique", f"job {j.name!r}")
        seen.add(j.name)
    return jobs


def load_jobs(path: str | Path) -> list[Job]:
    """Load and validate a jobs YAML file (its jobs' working directory: its own)."""
    return parse_jobs(read_yaml(path), str(path), Path(os.path.abspath(path)).parent)


NODE_FIELDS = ("names", "name", "gpu_type", "gpus", "gpu_memory_gb", "state")
CLUSTER_FIELDS = ("name", "partition", "network", "nodes")
NETWORK_FIELDS = ("intra_node_gbps", "inter_node_gbps")


def _hostlist_size(expr: str) -> int:
    """How many names ``expr`` expands to, counted without expanding it."""
    total = 0
    for piece in re.split(r",(?![^\[]*\])", expr):
        n = 1
        for group in re.findall(r"\[([^\]]*)\]", piece):
            count = 0
            for part in group.split(","):
                lo, _, hi = part.partition("-")
                if lo.strip().isdigit() and hi.strip().isdigit():
                    count += max(0, int(hi) - int(lo) + 1) if len(hi) < 12 else 10**12
                else:
                    count += 1
            n *= max(count, 1)
        total += n
    return total


def expand_hostlist(expr: str, source: str, where: str) -> list[str]:
    """Expand Slurm hostlist syntax (``a100-[1-4,7]``) with python-hostlist."""
    size = _hostlist_size(expr)
    if size > limits.MAX_NODES:
        raise InputError(source, f"hostlist {expr[:60]!r} names {size} nodes; the limit is "
                         f"{limits.MAX_NODES}", where)
    try:
        names = hostlist.expand_hostlist(expr)
    except hostlist.BadHostlist as e:
        raise InputError(source, f"bad hostlist {expr!r}: {e}; expected e.g. 'gpu-[1-4]'",
                         where) from None
    for n in names:
        if not NAME_RE.match(n):
            raise InputError(source, f"bad node name {n!r}: ASCII letters, digits, '.', '_', '-' only",
                             where)
    return names


def parse_cluster(data: Any, source: str) -> Cluster:
    """Validate a cluster document (see docs/formats.md)."""
    f = _Fields(data, source, "cluster", CLUSTER_FIELDS)
    net_raw = data.get("network") or {}
    net = _Fields(net_raw, source, "network", NETWORK_FIELDS)
    cb = limits.CLUSTER
    intra = net.num("intra_node_gbps", cb["intra_node_gbps"], 300.0)
    inter = net.num("inter_node_gbps", cb["inter_node_gbps"], 10.0)
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise InputError(source, "empty partition: expected a non-empty list under 'nodes:'")
    nodes: list[Node] = []
    seen: set[str] = set()
    total_gpus = 0
    for i, item in enumerate(raw_nodes):
        nf = _Fields(item, source, f"nodes[{i}]", NODE_FIELDS)
        if nf.has("names") == nf.has("name"):
            raise InputError(source, "give 'names' (hostlist, e.g. gpu-[1-4]) or 'name'",
                             f"nodes[{i}]")
        expr = nf.str_("names" if nf.has("names") else "name")
        gpu_type = nf.str_("gpu_type", pattern=GPU_TYPE_RE,
                           valid="a GPU type name such as a100, v100, t4").lower()
        gpus = nf.int_("gpus", cb["gpus"])
        mem = nf.num("gpu_memory_gb", cb["gpu_memory_gb"]) if nf.has("gpu_memory_gb") else None
        state = nf.str_("state", "idle").lower()
        if state not in NODE_STATES:
            raise InputError(source, f"unknown node state {state!r}; valid states: "
                             f"{', '.join(sorted(NODE_STATES))}", f"nodes[{i}]: state")
        names = expand_hostlist(expr, source, f"nodes[{i}]")
        total_gpus += gpus * len(names)
        if len(seen) + len(names) > limits.MAX_NODES or total_gpus > limits.MAX_TOTAL_GPUS:
            raise InputError(source, f"more than {limits.MAX_NODES} nodes or "
                             f"{limits.MAX_TOTAL_GPUS} GPUs in all; that is hetsched's limit",
                             f"nodes[{i}]")
        for name in names:
            if name in seen:
                raise InputError(source, f"node {name!r} is listed twice", f"nodes[{i}]")
            seen.add(name)
            nodes.append(Node(name=name, gpu_type=gpu_type, gpus=gpus, gpu_memory_gb=mem,
                              state=state))
    cluster = Cluster(
        nodes=tuple(nodes), intra_node_gbps=intra, inter_node_gbps=inter,
        name=f.str_("name", "cluster"),
        partition=f.str_("partition") if f.has("partition") else None,
    )
    if not cluster.gpus:
        raise InputError(source, "empty partition: no node is up (all are down or drained)")
    return cluster


def load_cluster(path: str | Path) -> Cluster:
    """Load and validate a cluster YAML file."""
    return parse_cluster(read_yaml(path), str(path))
