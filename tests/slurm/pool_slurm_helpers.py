"""Pool plans for the Slurm-side pool tests (imported by basename: tests/ has no package)."""

from __future__ import annotations

from typing import Any

import yaml

from hetsched.core.plan import Plan
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.io.specs import parse_cluster, parse_jobs

#: emulated cost at speed 1 (HETSCHED_EMULATE_COST) and speeds per type: the profiles
#: below are exactly what the executors will take, so the plan can predict them
EMULATE_COST = (1.0, 0.04)
EMULATE_SPEED = {"a100": 2.0, "v100": 1.0, "t4": 0.5}

THREE_JOBS = """
jobs:
  - {name: %(p)sa, workload: mlp, dataset_size: 960, epochs: 1, global_batch: 16,
     requested_gpus: 1, weight: 2}
  - {name: %(p)sb, workload: mlp, dataset_size: 640, epochs: 1, global_batch: 16,
     requested_gpus: 2}
  - {name: %(p)sc, workload: mlp, dataset_size: 480, epochs: 1, global_batch: 8,
     requested_gpus: 1}
"""


def emulated_rows(workload: str = "mlp", batches: tuple[int, ...] = (4, 8, 16, 32)
                  ) -> list[ProfileRow]:
    a, c = EMULATE_COST
    return [ProfileRow(workload, g, b, (a + c * b) / s)
            for g, s in EMULATE_SPEED.items() for b in batches]


def emulated_csv() -> str:
    return "workload,gpu_type,local_batch,step_time_s\n" + "".join(
        f"{r.workload},{r.gpu_type},{r.local_batch},{r.step_time_s:.6f}\n"
        for r in emulated_rows())


def cluster_yaml(nodes: list[tuple[str, str, int]]) -> dict[str, Any]:
    return {"name": "pooltest", "partition": "gpu",
            "nodes": [{"name": n, "gpu_type": t, "gpus": g} for n, t, g in nodes]}


def pool_plan(nodes: list[tuple[str, str, int]], jobs_yaml: str | None = None,
              prefix: str = "p", task_iterations: int | None = 10,
              policy: str = "hare") -> Plan:
    """A real pool plan (the planner's own) of ``jobs_yaml`` on ``nodes``."""
    from hetsched.planning.planner import make_plan

    jobs = parse_jobs(yaml.safe_load((jobs_yaml or THREE_JOBS) % {"p": prefix}), "test")
    cluster = parse_cluster(cluster_yaml(nodes), "test")
    return make_plan(jobs, cluster, ThroughputTable(emulated_rows()), policy=policy,
                     mode="pool", task_iterations=task_iterations)
