"""Pool plans for the Slurm-side pool tests (imported by basename: tests/ has no package)."""

from __future__ import annotations

from pathlib import Path
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


#: two jobs on one A100 and one V100; ``ua`` may use both (the planner gives it uneven
#: shares), ``ub`` one GPU
UNEVEN_JOBS = """
jobs:
  - {name: %(p)sa, workload: mlp, dataset_size: 4800, epochs: 1, global_batch: 48,
     max_gpus: 2}
  - {name: %(p)sb, workload: mlp, dataset_size: 560, epochs: 1, global_batch: 16,
     max_gpus: 1, weight: 3}
"""

#: rounds of ``<p>a`` as a space plan's segments give them (iterations, local batch of each
#: task): on both GPUs, then alone on the A100 (a segment's last round shorter), on both
#: again, split evenly, alone; 100 iterations in all, at most 5 a round
UNEVEN_LAYOUT: list[tuple[int, tuple[int, ...]]] = (
    [(5, (32, 16))] * 3 + [(3, (48,)), (2, (48,))] + [(5, (32, 16))] * 2
    + [(4, (24, 24)), (1, (48,))] + [(5, (32, 16))] * 13)


def with_layout(body: dict[str, Any], job: str, layout: list[tuple[int, tuple[int, ...]]]
                ) -> dict[str, Any]:
    """The plan file ``body`` with ``job``'s rows rewritten from ``layout`` (task ``t`` of
    a round on the plan's GPU ``t``, back to back after that GPU's other rows; one
    second per iteration) and every other row given its own batch and iterations."""
    from hetsched.core.pool_tasks import UNEVEN_COLUMNS, TaskRun, row_from_list
    from hetsched.runtime.sampler import split_counts

    t = body["tasks"]
    meta = t["jobs"]
    specs = {j["name"]: j["spec"] for j in body["jobs"]}
    gpus, clock = t["gpus"], {}
    for g in gpus:
        rows = [r.to_list() for run in g["runs"] for r in TaskRun(
            tuple(row_from_list(x) for x in run["tasks"]), run["repeat"],
            run.get("period_s"), run.get("round_step")).expand() if r.job != job]
        for r in rows:
            if len(r) == 8:
                m = meta[r[0]]
                b = split_counts(specs[r[0]]["global_batch"],
                                 [m["local_batch"]] * m["tasks_per_round"])[r[2]]
                last = r[1] == m["rounds"] - 1
                r += [b, m["last_round_iterations"] if last else m["iterations_per_task"]]
        g["runs"] = [{"repeat": 1, "tasks": [r]} for r in rows]
        clock[id(g)] = max((r[4] for r in rows), default=0.0)
    for rnd, (n, batches) in enumerate(layout):
        for task, b in enumerate(batches):
            g = gpus[task]
            st = clock[id(g)]
            clock[id(g)] = st + n
            g["runs"].append({"repeat": 1, "tasks": [
                [job, rnd, task, st, st + n, st + n, "keep", [], b, n]]})
    meta[job] = dict(meta[job], rounds=len(layout), tasks_per_round=max(
        len(b) for _, b in layout), iterations_per_task=max(n for n, _ in layout),
        last_round_iterations=layout[-1][0], local_batch=max(max(b) for _, b in layout))
    for g in gpus:
        g["tasks"] = len(g["runs"])
    t["columns"] = list(UNEVEN_COLUMNS)
    t["total_tasks"] = t["stored_rows"] = sum(len(g["runs"]) for g in gpus)
    body["plan_id"] = None
    return body


def uneven_plan(prefix: str) -> Plan:
    """A pool plan whose job ``<prefix>a`` has :data:`UNEVEN_LAYOUT`'s rounds (different
    iterations and task counts from round to round), read back as a plan file is."""
    from hetsched.io.plan_json import plan_from_dict

    body = pool_plan([("a100-1", "a100", 1), ("v100-1", "v100", 1)], UNEVEN_JOBS,
                     prefix=prefix, task_iterations=5).to_dict()
    plan = plan_from_dict(with_layout(body, f"{prefix}a", UNEVEN_LAYOUT), "uneven plan")
    plan.plan_id = str(plan.to_dict()["plan_id"])
    return plan


def report_rounds(report_dir: str | Path, plan: Plan, upto: dict[str, int],
                   partial: dict[str, int] | None = None, t0: float = 1000.0) -> None:
    """Task records of each job's rounds ``from..upto[job]-1`` (``from``: its first round
    in the plan) and, for ``partial[job]``, that round's task 0 alone."""
    from hetsched.io.pool_reports import report_path
    from hetsched.io.reports import ReportWriter

    assert plan.tasks is not None
    for g in plan.tasks.gpus:
        rep = ReportWriter(report_path(report_dir, str(plan.plan_id), g.id))
        for r in g.rows():
            if not (r.round < upto.get(r.job, 0)
                    or (r.round == (partial or {}).get(r.job) and r.task == 0)):
                continue
            n, b = r.iterations or 1, r.local_batch or 1
            rep.write("task", job=r.job, round=r.round, task=r.task, gpu=g.id,
                      gpu_type=g.gpu_type, iterations=n, samples=n * b,
                      compute_s=r.end_s - r.start_s, switch_s=0.001, start=t0 + r.start_s,
                      end=t0 + r.end_s)
