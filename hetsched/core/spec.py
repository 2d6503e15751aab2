"""Job specs and cluster descriptions: validated, immutable domain types.

The file formats that build them live in :mod:`hetsched.io.specs`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from hetsched.core import limits
from hetsched.core.sbatch import SbatchOptions
from hetsched.errors import InputError

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_-]+$")
#: a workload is an identifier: it names profiles, reaches probe scripts and
#: job environments, so it never carries spaces, quotes or control characters
WORKLOAD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
WORKLOAD_VALID = "1-128 ASCII letters, digits, '.', '_', '+' or '-', starting with a letter or digit"

# Node states as Slurm reports them, reduced to what the planner needs.
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing", "planned", "up"})
#: how an elastic job's learning rate follows its global batch (docs/elastic.md)
LR_SCALINGS = ("linear", "sqrt", "none")


@dataclass(frozen=True)
class Elastic:
    """A job whose global batch the planner may choose in [min_batch, max_batch].

    ``lr_scaling`` is how the runtime rescales the learning rate with the batch
    (relative to the user's ``global_batch``): ``linear`` (Goyal et al.),
    ``sqrt`` or ``none``.
    """

    min_batch: int
    max_batch: int
    lr_scaling: str = "linear"
    #: gradient noise scale B_noise (runtime-measured, docs/elastic.md); None = unknown,
    #: i.e. ONES's assumption that the LR rule keeps samples-to-converge constant
    noise_scale: float | None = None

    def lr_factor(self, batch: int, base_batch: int) -> float:
        """Learning-rate multiplier at ``batch`` for a job tuned at ``base_batch``."""
        r = batch / base_batch
        return r if self.lr_scaling == "linear" else r ** 0.5 if self.lr_scaling == "sqrt" \
            else 1.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"min_batch": self.min_batch, "max_batch": self.max_batch,
                             "lr_scaling": self.lr_scaling}
        if self.noise_scale is not None:
            d["noise_scale"] = self.noise_scale
        return d
#: states a node may be given in a cluster file: the usable ones and Slurm's others
NODE_STATES = USABLE_STATES | frozenset({
    "down", "drain", "drained", "draining", "fail", "failing", "maint", "reserved",
    "future", "unknown", "power_down", "powered_down", "powering_down", "powering_up",
    "inval", "not_responding", "reboot_requested", "blocked",
})


@dataclass(frozen=True)
class Job:
    """One training job of the batch.

    ``iterations`` is what the planner schedules: epochs times the number of
    global batches per epoch (the last, partial batch counts as a full step).
    """

    name: str
    workload: str
    dataset_size: int
    epochs: float
    global_batch: int
    weight: float = 1.0
    arrival_s: float = 0.0
    model_size_mb: float = 0.0
    min_gpus: int = 1
    max_gpus: int | None = None
    gpu_types: tuple[str, ...] | None = None
    requested_gpus: int | None = None
    command: tuple[str, ...] | None = None
    entrypoint: str | None = None
    #: the directory the job runs in (absolute): its command's relative paths and its
    #: entrypoint's module are found there; a jobs file's jobs default to its directory
    workdir: str | None = None
    #: GPU memory (GB) the job's model state needs resident (weights, gradients,
    #: optimizer state); used by pool mode's speculative memory plan. None = estimate.
    memory_gb: float | None = None
    #: the planner may choose the global batch in this range (ONES; docs/elastic.md)
    elastic: Elastic | None = None
    #: train until this loss instead of for ``epochs``; ``epochs`` is then predicted
    target_loss: float | None = None
    #: ``epochs`` is a prediction (target_loss jobs), not the user's number
    epochs_predicted: bool = False
    #: how the job is submitted (time limit, account, ...); None = the defaults
    slurm: SbatchOptions | None = None

    def __post_init__(self) -> None:
        check_job(self, "Job")

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.dataset_size / self.global_batch)

    @property
    def iterations(self) -> float:
        return self.epochs * self.steps_per_epoch

    @property
    def requested(self) -> int:
        """GPU count asked for by baselines that take a fixed size (FIFO, SRTF, Homo)."""
        if self.requested_gpus is not None:
            return self.requested_gpus
        return self.min_gpus

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "workload": self.workload,
            "dataset_size": self.dataset_size,
            "epochs": self.epochs,
            "global_batch": self.global_batch,
            "weight": self.weight,
            "arrival_s": self.arrival_s,
        }
        if self.model_size_mb:
            d["model_size_mb"] = self.model_size_mb
        if self.min_gpus != 1:
            d["min_gpus"] = self.min_gpus
        if self.max_gpus is not None:
            d["max_gpus"] = self.max_gpus
        if self.gpu_types is not None:
            d["gpu_types"] = list(self.gpu_types)
        if self.requested_gpus is not None:
            d["requested_gpus"] = self.requested_gpus
        if self.command is not None:
            d["command"] = list(self.command)
        if self.entrypoint is not None:
            d["entrypoint"] = self.entrypoint
        if self.workdir is not None:
            d["workdir"] = self.workdir
        if self.memory_gb is not None:
            d["memory_gb"] = self.memory_gb
        if self.elastic is not None:
            d["elastic"] = self.elastic.to_dict()
        if self.target_loss is not None:
            d["target_loss"] = self.target_loss
        if self.epochs_predicted:
            d["epochs_predicted"] = True
        if self.slurm:
            d["slurm"] = self.slurm.to_dict()
        return d


def check_job(job: Job, source: str) -> None:
    """Validate a job built in code as a jobs file would be (one-line InputError)."""
    name = job.name
    where = f"job {name!r}" if isinstance(name, str) else "job"
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 256:
        raise InputError(source, f"{str(name)[:60]!r} is not valid; expected 1-256 letters, "
                         "digits, '.', '_' or '-'", "name")
    if not isinstance(job.workload, str) or not WORKLOAD_RE.match(job.workload):
        raise InputError(source, f"{job.workload!r} is not valid; expected {WORKLOAD_VALID}",
                         f"{where}: workload")
    for key, bound in limits.JOB.items():
        value = getattr(job, key)
        if value is None and key in ("max_gpus", "requested_gpus", "memory_gb"):
            continue
        msg = limits.check_number(value, bound)
        if msg:
            raise InputError(source, msg, f"{where}: {key}")
    if job.max_gpus is not None and job.max_gpus < job.min_gpus:
        raise InputError(source, f"must be >= min_gpus ({job.min_gpus}), got {job.max_gpus}",
                         f"{where}: max_gpus")
    if job.gpu_types is not None and (
            not isinstance(job.gpu_types, (tuple, list)) or not job.gpu_types
            or not all(isinstance(t, str) and GPU_TYPE_RE.match(t) for t in job.gpu_types)):
        raise InputError(source, "expected a non-empty tuple of GPU type names",
                         f"{where}: gpu_types")
    if job.command is not None and job.entrypoint is not None:
        raise InputError(source, "give either 'command' or 'entrypoint', not both", where)
    if job.workdir is not None and not (isinstance(job.workdir, str)
                                        and os.path.isabs(job.workdir)):
        raise InputError(source, f"{str(job.workdir)[:60]!r} is not an absolute path",
                         f"{where}: workdir")
    el = job.elastic
    if el is not None and not (isinstance(el, Elastic) and el.lr_scaling in LR_SCALINGS
                               and 1 <= el.min_batch <= job.global_batch <= el.max_batch):
        raise InputError(source, "expected Elastic(min_batch <= global_batch <= max_batch, "
                         f"lr_scaling in {', '.join(LR_SCALINGS)})", f"{where}: elastic")


@dataclass(frozen=True)
class Node:
    """A node of the partition: one GPU type, a GPU count, and its Slurm state."""

    name: str
    gpu_type: str
    gpus: int
    gpu_memory_gb: float | None = None
    state: str = "idle"

    @property
    def usable(self) -> bool:
        return self.state in USABLE_STATES


@dataclass(frozen=True)
class GPU:
    """One GPU: its node, its type, and its index within the node."""

    node: str
    gpu_type: str
    index: int


@dataclass(frozen=True)
class Cluster:
    """A partition's GPU mix and network.

    Bandwidths are in Gbit/s; ``intra_node_gbps`` applies when all workers of
    a job sit on one node (PCIe/NVLink), ``inter_node_gbps`` otherwise.
    """

    nodes: tuple[Node, ...]
    intra_node_gbps: float = 300.0
    inter_node_gbps: float = 10.0
    name: str = "cluster"
    partition: str | None = None
    gpus: tuple[GPU, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        gpus = tuple(
            GPU(n.name, n.gpu_type, i) for n in self.nodes if n.usable for i in range(n.gpus)
        )
        object.__setattr__(self, "gpus", gpus)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu_type for n in self.nodes if n.usable}))

    def count_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            if n.usable:
                out[n.gpu_type] = out.get(n.gpu_type, 0) + n.gpus
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "partition": self.partition,
            "network": {
                "intra_node_gbps": self.intra_node_gbps,
                "inter_node_gbps": self.inter_node_gbps,
            },
            "nodes": [
                {
                    "names": n.name,
                    "gpu_type": n.gpu_type,
                    "gpus": n.gpus,
                    **({"gpu_memory_gb": n.gpu_memory_gb} if n.gpu_memory_gb else {}),
                    **({"state": n.state} if n.state != "idle" else {}),
                }
                for n in self.nodes
            ],
        }
