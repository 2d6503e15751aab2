"""Co-location group plans built by hand (until the harmony policy makes them), shared by
the runtime and Slurm group tests (imported by basename: tests/ has no package)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hetsched.core.plan import JobPlan, Plan, Segment, Worker
from hetsched.core.spec import Job
from hetsched.io.plan_json import dump_plan

#: (node, gpu_type, gpu index) of the GPUs a test group shares
TWO_NODES = (("n1", "v100", 0), ("n2", "v100", 0))


def group_job(name: str, workload: str, batches: Sequence[int], *, dataset_size: int,
              epochs: float = 1, slots: Sequence[tuple[str, str, int]] = TWO_NODES,
              group: str | None = "g1", start_s: float = 0.0, end_s: float = 100.0,
              compute_s: float = 0.0, comm_s: float = 0.0) -> JobPlan:
    """One job whose only segment runs ``batches[k]`` samples per step on ``slots[k]``."""
    spec = Job(name=name, workload=workload, dataset_size=dataset_size, epochs=epochs,
               global_batch=sum(batches), requested_gpus=len(slots))
    workers = [Worker(n, t, g, b) for (n, t, g), b in zip(slots, batches, strict=True)]
    seg = Segment(start_s, end_s, workers, iteration_s=compute_s + comm_s,
                  compute_s=compute_s, comm_s=comm_s, group=group)
    return JobPlan(name, 1.0, 0.0, [seg], spec)


def group_plan(jobs: Sequence[JobPlan], cluster: dict | None = None) -> Plan:
    nodes = sorted({(w.node, w.gpu_type) for j in jobs for s in j.segments for w in s.workers})
    return Plan("hand", list(jobs), 1.0, cluster=cluster or {
        "name": "t", "nodes": [{"name": n, "gpu_type": t, "gpus": 1} for n, t in nodes]})


def write_plan(plan: Plan, path: Path) -> Path:
    path.write_text(dump_plan(plan) + "\n")
    return path
