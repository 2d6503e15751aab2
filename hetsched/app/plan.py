"""The one plan use case: ``plan``, ``submit jobs.yaml``, ``replan`` and ``simulate``.

Every command that plans asks here, with one :class:`~hetsched.core.plan.PlanSettings`
(mode, policy, parameters, static, restart cost, task size), so no setting is lost
between them:

* :func:`plan_settings` fills what the caller left out from the settings
  (``restart_cost_s``: ``--restart-cost``, else ``$HETSCHED_RESTART_COST`` / config,
  else :data:`hetsched.config.DEFAULT_RESTART_COST_S`). :func:`plan_jobs` passes the
  time budget of ``auto`` (``plan_budget_s``); how many processes ``auto`` may use
  (``plan_workers``) depends on the problem's size and is read where that is known
  (``planning.select.default_workers``).
* :func:`load_inputs` reads the cluster (a YAML, else the Slurm partition), the
  throughputs (a CSV, else the profile history) and the completed jobs' progress
  history (when the policy or a ``target_loss`` job needs it).
* :func:`plan_jobs` plans, with ``--skip-unplaceable``; replan passes its hints
  (held GPUs, epochs done) and the store's history.
* :func:`plan_jobs_file` is the two together for a jobs file.
* :func:`how_planned`: replan's settings, the active plan's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetsched import config
from hetsched.core.plan import PlanSettings
from hetsched.errors import InputError

if TYPE_CHECKING:
    from hetsched.core.plan import Plan
    from hetsched.core.report import BaseReporter
    from hetsched.core.spec import Cluster, Job
    from hetsched.core.throughput import ThroughputTable
    from hetsched.state.store import Store

#: completed jobs' (features, progress) pairs, as ``state.progress.progress_points`` gives
History = tuple[Any, Any]


def parse_params(params: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--param KEY=VALUE`` options as a dict (the value typed: int, float, bool, str)."""
    from hetsched.planning.space.policies.base import parse_param

    return dict(parse_param(p) for p in params)


def plan_settings(*, mode: str = "space", policy: str = "auto",
                  params: Mapping[str, Any] | None = None, static: bool = False,
                  restart_cost_s: float | None = None,
                  task_iterations: int | None = None) -> PlanSettings:
    """The request, with the configured defaults for what the caller left as None."""
    rc = config.get("restart_cost_s") if restart_cost_s is None else restart_cost_s
    return PlanSettings(mode=mode, policy=policy, params=dict(params or {}), static=static,
                        restart_cost_s=float(rc), task_iterations=task_iterations)


def how_planned(old: Plan | None, policy: str | None) -> PlanSettings:
    """The settings for the next plan (replan): the active plan's own, ``policy`` overriding.

    A plan made with ``--static --restart-cost 10 --policy jps --param
    samples=80`` (or ``--mode pool``) is replanned the same way. Plans from
    before settings were recorded fall back to their policy label and the
    configured restart cost. A batch stays in the mode it runs in: a plan asked
    for with ``--mode auto`` is replanned in the mode auto chose (its jobs are
    that mode's Slurm jobs), with ``auto`` for a policy that mode does not have.
    """
    if old is not None and old.settings is not None:
        s = old.settings
    else:
        label = old.policy if old is not None else "auto"
        s = plan_settings(mode=old.mode if old is not None else "space",
                          policy="auto" if label.startswith("auto") else label)
    if policy is not None and policy != s.policy:
        s = dataclasses.replace(s, policy=policy, params={})
    if old is not None and s.mode != old.mode:
        from hetsched.planning import registry

        keep = s.policy == "auto" or s.policy in registry.policies(old.mode)
        s = dataclasses.replace(s, mode=old.mode, policy=s.policy if keep else "auto",
                                params=s.params if keep else {})
    return s


@dataclass
class PlanInputs:
    """What a plan is made from, loaded once."""

    jobs: list[Job]
    cluster: Cluster
    table: ThroughputTable
    history: History | None = None
    jobs_source: str = "jobs"


def load_cluster(cluster_file: str | None, partition: str | None) -> Cluster:
    """The cluster YAML, else the partition as Slurm reports it (one ``sinfo``)."""
    from hetsched.io.specs import load_cluster as load_yaml

    if cluster_file:
        return load_yaml(cluster_file)
    import shutil

    from hetsched.slurm.client import CliSlurmClient
    from hetsched.slurm.inventory import load_cluster_from_slurm

    if shutil.which("sinfo") is None:
        raise InputError("--cluster", "no cluster file given and no Slurm here (sinfo not "
                         "found); pass --cluster cluster.yaml (see examples/cluster.yaml)")
    return load_cluster_from_slurm(CliSlurmClient(), partition or config.get("partition")
                                   or None)


def load_throughputs(tp_file: str | None, store: Store | None = None) -> ThroughputTable:
    """The throughput CSV, else the profile history (``store``'s, else the state file's).

    Planning never creates a state file as a side effect.
    """
    from hetsched.io.profiles import load_throughputs as load_csv
    from hetsched.state.history import table_from_store

    if tp_file:
        return load_csv(tp_file)
    if store is not None:
        return table_from_store(store)
    from hetsched.state.store import open_store

    path = config.state_path()
    if not Path(path).exists():
        raise InputError("--throughputs", f"no throughput CSV given and no profile history at "
                         f"{path}; run `hetsched profile JOBS.yaml` or pass --throughputs "
                         "profiles.csv (e.g. examples/gavel_throughputs.csv)")
    with open_store(path) as st:
        return table_from_store(st)


def progress_history(policy: str, jobs: list[Job], store: Store | None = None
                     ) -> History | None:
    """Completed jobs' training history, for a policy that predicts remaining work
    (``ones``) or a ``target_loss`` job's length (any policy); None when neither needs
    it or there is no state file (``store``: read that one)."""
    from hetsched.planning.space.policies.base import REGISTRY
    from hetsched.state.progress import progress_points

    if not (getattr(REGISTRY.get(policy), "uses_progress_history", False)
            or any(j.epochs_predicted for j in jobs)):
        return None
    if store is not None:
        return progress_points(store)
    from hetsched.state.store import open_store_readonly

    st = open_store_readonly()
    if st is None:
        return None
    try:
        return progress_points(st)
    finally:
        st.close()


def load_inputs(jobs_file: str | Path, settings: PlanSettings, *, cluster_file: str | None,
                partition: str | None, tp_file: str | None, history: bool = True
                ) -> PlanInputs:
    """A jobs file (YAML, or a Gavel ``.trace``) and everything planning it needs
    (``history``: also the progress history, where the policy or a job needs it)."""
    from hetsched.io.specs import load_jobs, parse_jobs

    src = str(jobs_file)
    if src.endswith(".trace"):  # a Gavel trace as is (what `convert gavel-trace` reads)
        from hetsched.io.traces import parse_trace

        jobs = parse_jobs(parse_trace(src)[0], src)
    else:
        jobs = load_jobs(jobs_file)
    cluster = load_cluster(cluster_file, partition)
    table = load_throughputs(tp_file)
    hist = progress_history(settings.policy, jobs) if history else None
    return PlanInputs(jobs, cluster, table, hist, src)


def plan_jobs(inputs: PlanInputs, settings: PlanSettings, *, skip_unplaceable: bool = False,
              reporter: BaseReporter | None = None,
              warn: Callable[[str], None] | None = None,
              epochs_done: dict[str, float] | None = None,
              prefer_gpus: dict[str, list[tuple[str, int]]] | None = None,
              running_gpus: dict[str, list[tuple[str, int]]] | None = None,
              running_fixed: bool = False) -> Plan:
    """Plan ``inputs`` as ``settings`` asks; the plan records ``settings``.

    ``skip_unplaceable``: plan the jobs that fit, list the others (the plan's
    ``skipped_unplaceable``). ``epochs_done``, ``prefer_gpus``, ``running_gpus`` and
    ``running_fixed`` are replan's
    (``hetsched.planning.planner.make_plan`` says what they do).
    """
    from hetsched.app.runnable import plan_placeable

    return plan_placeable(inputs.jobs, inputs.cluster, inputs.table,
                          skip_unplaceable=skip_unplaceable, jobs_source=inputs.jobs_source,
                          warn=warn, reporter=reporter, progress_history=inputs.history,
                          epochs_done=epochs_done, prefer_gpus=prefer_gpus,
                          running_gpus=running_gpus, running_fixed=running_fixed,
                          budget_s=float(config.get("plan_budget_s")),
                          **settings.make_plan_kwargs())


def plan_jobs_file(jobs_file: str | Path, settings: PlanSettings, *, cluster_file: str | None,
                   partition: str | None, tp_file: str | None,
                   skip_unplaceable: bool = False, reporter: BaseReporter | None = None,
                   warn: Callable[[str], None] | None = None) -> tuple[Plan, PlanInputs]:
    """Load a jobs file's inputs and plan them (``plan``, ``submit jobs.yaml``)."""
    inputs = load_inputs(jobs_file, settings, cluster_file=cluster_file, partition=partition,
                         tp_file=tp_file)
    return plan_jobs(inputs, settings, skip_unplaceable=skip_unplaceable, reporter=reporter,
                     warn=warn), inputs
