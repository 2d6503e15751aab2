"""JobEnvironment: a job step's identity read from its environment in one place."""

from __future__ import annotations

import pytest

from hetsched.config import JOB_ENV
from hetsched.errors import InputError
from hetsched.runtime.environment import JobEnvironment

STEP = {"HETSCHED_PLAN_ID": "p1", "HETSCHED_JOB": "j", "HETSCHED_SEGMENT": "1",
        "HETSCHED_LAYOUT": "/f/layouts/p1/j-1.json", "HETSCHED_WORKLOAD": "mlp",
        "HETSCHED_LOCAL_BATCHES": "24,40", "HETSCHED_GPU_TYPES": "v100,a100",
        "HETSCHED_ENTRYPOINT": "m:f", "HETSCHED_POOL_GPUS": "n1-g0,n2-g1",
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n2",
        "SLURM_CPUS_PER_TASK": "4", "SLURM_STEP_NODELIST": "n1,n2"}


def test_every_variable_is_read_typed() -> None:
    e = JobEnvironment.from_env(STEP)
    assert (e.plan_id, e.job, e.segment, e.layout, e.workload) == (
        "p1", "j", 1, "/f/layouts/p1/j-1.json", "mlp")
    assert e.local_batches == (24, 40) and e.gpu_types == ("v100", "a100")
    assert e.pool_gpus == ("n1-g0", "n2-g1") and e.entrypoint == "m:f"
    assert (e.slurm_job_id, e.slurm_step_id, e.local_id, e.node, e.cpus_per_task) == (
        "77", "0", 1, "n2", 4)
    assert e.in_slurm
    r = e.rank  # the rank layout: Slurm's numbering across the step
    assert (r.rank, r.world_size, r.job_id, r.source) == (1, 2, "77", "slurm")
    assert "HETSCHED_LOCAL_BATCHES" not in e.without("HETSCHED_LOCAL_BATCHES")


def test_reads_the_template_protocol() -> None:
    """The variables the templates export (config.JOB_ENV) are the ones read here."""
    import inspect

    import hetsched.runtime.environment as mod

    src = inspect.getsource(mod)
    unread = [v for v in JOB_ENV if v not in src and v not in (
        "HETSCHED_GLOBAL_BATCH", "HETSCHED_LOCAL_BATCH", "HETSCHED_RANK_NODES",
        "HETSCHED_RANK", "HETSCHED_COMMAND")]  # for a `command` job's own program
    assert unread == []


def test_outside_slurm_and_malformed() -> None:
    e = JobEnvironment.from_env({})
    assert not e.in_slurm and e.segment is None and e.local_batches == ()
    assert e.rank.source == "single"
    with pytest.raises(InputError, match="HETSCHED_LOCAL_BATCHES"):
        JobEnvironment.from_env({"HETSCHED_LOCAL_BATCHES": "8,x"})
    with pytest.raises(InputError, match="HETSCHED_SEGMENT"):
        JobEnvironment.from_env({"HETSCHED_SEGMENT": "-1"})
