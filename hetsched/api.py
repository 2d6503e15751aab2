"""The Python API: what the command line does, callable from a notebook or a script.

::

    import hetsched

    jobs = hetsched.load_jobs("jobs.yaml")
    cluster = hetsched.load_cluster("cluster.yaml")
    profiles = hetsched.load_profiles("profiles.csv")
    plan = hetsched.plan(jobs, cluster, profiles, policy="auto")
    rows = plan.rows()            # one dict per job: a pandas.DataFrame(rows) takes it
    hetsched.save_plan(plan, "plan.json")
    result = hetsched.submit(plan, dry_run=True)

Every function raises :class:`hetsched.InputError` (bad input: the message
names the file or field and what would be valid) or
:class:`hetsched.PlanningError`; nothing prints. docs/api.md walks through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.plan import Plan
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.io.plan_json import load_plan, save_plan
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, load_jobs


def load_profiles(source: str | Path | Sequence[ProfileRow]) -> ThroughputTable:
    """Profiles from a CSV file (docs/formats.md) or from :class:`ProfileRow` objects."""
    if isinstance(source, (str, Path)):
        return load_throughputs(source)
    return ThroughputTable(list(source))


def plan(jobs: Sequence[Job], cluster: Cluster, profiles: ThroughputTable, *,
         policy: str = "auto", params: dict[str, Any] | None = None, mode: str = "space",
         static: bool = False, restart_cost_s: float = DEFAULT_RESTART_COST_S,
         task_iterations: int | None = None) -> Plan:
    """Plan ``jobs`` on ``cluster`` (``hetsched plan``); see docs/policies.md for policies."""
    from hetsched.planning.planner import make_plan

    return make_plan(list(jobs), cluster, profiles, policy=policy, params=params, mode=mode,
                     static=static, restart_cost_s=restart_cost_s,
                     task_iterations=task_iterations, jobs_source="api")


def submit(plan: Plan, *, dry_run: bool = False, partition: str | None = None,
           state: str | Path | None = None) -> Any:
    """Submit ``plan`` to Slurm (``hetsched submit``); ``dry_run`` only renders the scripts.

    Returns the submit result: ``submitted`` (job, Slurm id) pairs, and the
    rendered ``scripts``.
    """
    from hetsched.app.submit import submit as submit_plan

    if dry_run:
        return submit_plan(plan, None, None, dry_run=True, partition=partition, source="api")
    from hetsched.slurm.client import make_client
    from hetsched.state.store import open_store

    client, _ = make_client()
    with open_store(Path(state) if state is not None else None) as st:
        return submit_plan(plan, st, client, partition=partition, source="api")


__all__ = ["Cluster", "Job", "Plan", "ProfileRow", "ThroughputTable", "load_cluster",
           "load_jobs", "load_plan", "load_profiles", "plan", "save_plan", "submit"]
