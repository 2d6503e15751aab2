"""Who a job step is, read from its environment in one place (as submitit's JobEnvironment).

A step of a hetsched job (``hetsched run`` or ``hetsched exec`` under ``srun``)
learns its place from two sets of variables:

* the protocol the sbatch templates export (``config.JOB_ENV``): the plan and
  job, the segment, the layout file, every rank's local batch and GPU type, the
  pool's executor GPUs, a ``command`` job's program;
* Slurm's own (``SLURM_*``): job and step ids, this task's rank and local id,
  the node; or torchrun's (``RANK``/``WORLD_SIZE``/...) outside Slurm.

:meth:`JobEnvironment.from_env` reads them once, typed; :attr:`JobEnvironment.rank`
is the rank layout (``runtime.launcher.from_env``: rank, world size, rendezvous).
Command-line options win over the environment where both name a thing (``--segment``,
``--layout``); the layout file wins over the plan (runtime/job.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hetsched.errors import InputError

if TYPE_CHECKING:
    from hetsched.runtime.launcher import RankEnv

#: the pool executors' GPU ids, in rank order (slurm/pool_script.py sets it)
POOL_GPUS_VAR = "HETSCHED_POOL_GPUS"
#: the pool job's key file (slurm/pool_script.py sets it; io/secret.py reads it)
KEY_FILE_VAR = "HETSCHED_POOL_KEY_FILE"


def _ints(raw: str, var: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in raw.split(",")) if raw else ()
    except ValueError:
        raise InputError(var, f"{raw!r} is not a comma-separated list of integers") from None


def _list(raw: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in raw.split(",") if x.strip()) if raw else ()


@dataclass(frozen=True)
class JobEnvironment:
    """This job step's identity and place, from its environment (see module doc)."""

    plan_id: str = ""          # HETSCHED_PLAN_ID
    job: str = ""              # HETSCHED_JOB
    segment: int | None = None  # HETSCHED_SEGMENT
    layout: str = ""           # HETSCHED_LAYOUT: the rank layout file (io/layout.py)
    workload: str = ""         # HETSCHED_WORKLOAD
    local_batches: tuple[int, ...] = ()  # HETSCHED_LOCAL_BATCHES, rank order
    gpu_types: tuple[str, ...] = ()      # HETSCHED_GPU_TYPES, rank order
    entrypoint: str = ""       # HETSCHED_ENTRYPOINT
    pool_gpus: tuple[str, ...] = ()      # HETSCHED_POOL_GPUS: pool executors, rank order
    key_file: str = ""         # HETSCHED_POOL_KEY_FILE: the pool job's key
    slurm_job_id: str = ""     # SLURM_JOB_ID
    slurm_step_id: str = ""    # SLURM_STEP_ID
    local_id: int = 0          # SLURM_LOCALID, else LOCAL_RANK: the GPU index on the node
    node: str = ""             # SLURMD_NODENAME
    cpus_per_task: int | None = None  # SLURM_CPUS_PER_TASK
    env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobEnvironment:
        """Read every variable once; one InputError line naming a malformed one."""
        env = dict(os.environ if env is None else env)
        seg = env.get("HETSCHED_SEGMENT", "")
        local = env.get("SLURM_LOCALID", env.get("LOCAL_RANK", "0")) or "0"
        cpus = env.get("SLURM_CPUS_PER_TASK", "")
        for var, raw in (("HETSCHED_SEGMENT", seg), ("SLURM_LOCALID", local)):
            if raw and not raw.isdigit():
                raise InputError(var, f"{raw!r} is not a non-negative integer")
        return cls(
            plan_id=env.get("HETSCHED_PLAN_ID", ""), job=env.get("HETSCHED_JOB", ""),
            segment=int(seg) if seg else None, layout=env.get("HETSCHED_LAYOUT", ""),
            workload=env.get("HETSCHED_WORKLOAD", ""),
            local_batches=_ints(env.get("HETSCHED_LOCAL_BATCHES", ""), "HETSCHED_LOCAL_BATCHES"),
            gpu_types=_list(env.get("HETSCHED_GPU_TYPES", "")),
            entrypoint=env.get("HETSCHED_ENTRYPOINT", ""),
            pool_gpus=_list(env.get(POOL_GPUS_VAR, "")), key_file=env.get(KEY_FILE_VAR, ""),
            slurm_job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", ""),
            slurm_step_id=env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID", ""),
            local_id=int(local), node=env.get("SLURMD_NODENAME", ""),
            cpus_per_task=int(cpus) if cpus.isdigit() and int(cpus) > 0 else None,
            env=env)

    @property
    def in_slurm(self) -> bool:
        return bool(self.slurm_job_id)

    @property
    def rank(self) -> RankEnv:
        """Rank, world size, node and rendezvous (Slurm's, torchrun's, or a single process)."""
        from hetsched.runtime.launcher import from_env

        return from_env(self.env)

    def without(self, *names: str) -> dict[str, str]:
        """The variables less ``names`` (a group's jobs each have their own local batches)."""
        return {k: v for k, v in self.env.items() if k not in names}
