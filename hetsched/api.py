"""The Python API: what the command line does, callable from a notebook or a script.

::

    import hetsched

    jobs = hetsched.load_jobs("jobs.yaml")
    cluster = hetsched.load_cluster("cluster.yaml")
    profiles = hetsched.load_profiles("profiles.csv")
    plan = hetsched.plan(jobs, cluster, profiles, policy="auto")
    rows = plan.rows()            # one dict per job: a pandas.DataFrame(rows) takes it
    hetsched.save_plan(plan, "plan.json")
    batch = hetsched.submit(plan)           # a handle per job
    batch["resnet"].wait()                  # .state, .cancel(), .stdout(), .result()

Every function raises :class:`hetsched.InputError` (bad input: the message
names the file or field and what would be valid) or
:class:`hetsched.PlanningError`; nothing prints. docs/api.md walks through it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetsched.core.plan import Plan
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.io.plan_json import load_plan, save_plan
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, load_jobs, parse_cluster, parse_jobs


def load_profiles(source: str | Path | Sequence[ProfileRow | Mapping[str, Any]]
                  | ThroughputTable) -> ThroughputTable:
    """Profiles from a CSV file (docs/formats.md), :class:`ProfileRow` objects or dicts
    with ProfileRow's fields (``workload``, ``gpu_type``, ``local_batch``, ``step_time_s``...)."""
    if isinstance(source, ThroughputTable):
        return source
    if isinstance(source, (str, Path)):
        return load_throughputs(source)
    rows: list[ProfileRow] = []
    for k, r in enumerate(source):
        if isinstance(r, ProfileRow):
            rows.append(r)
            continue
        try:
            rows.append(ProfileRow(**dict(r)))
        except TypeError as e:
            raise InputError("profiles", f"row {k}: {e}; a row has workload, gpu_type, "
                             "local_batch, step_time_s[, sync_time_s, max_local_batch, gpus]",
                             ) from None
    return ThroughputTable(rows, "api")


def _jobs(jobs: str | Path | Mapping[str, Any] | Sequence[Job | Mapping[str, Any]]
          ) -> list[Job]:
    """Jobs from a YAML path, a jobs document (``{"jobs": [...]}``), dicts or Jobs."""
    if isinstance(jobs, (str, Path)):
        return load_jobs(jobs)
    if isinstance(jobs, Mapping):
        return parse_jobs(dict(jobs), "jobs")
    items = list(jobs)
    if all(isinstance(j, Job) for j in items):
        return [j for j in items if isinstance(j, Job)]
    if all(isinstance(j, Mapping) for j in items):
        return parse_jobs({"jobs": [dict(j) for j in items if isinstance(j, Mapping)]}, "jobs")
    raise InputError("jobs", "give a jobs YAML path, a {'jobs': [...]} dict, or a list of "
                     "Job objects or dicts (not a mix)")


def _cluster(cluster: str | Path | Mapping[str, Any] | Cluster) -> Cluster:
    """A cluster from a YAML path, a cluster document (dict) or a Cluster."""
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, (str, Path)):
        return load_cluster(cluster)
    if isinstance(cluster, Mapping):
        return parse_cluster(dict(cluster), "cluster")
    raise InputError("cluster", f"got {type(cluster).__name__}; give a cluster YAML path, "
                     "a dict with its fields, or a Cluster")


#: the command line's flags and the API's keyword arguments they stand for
_FLAGS = {"--policy": "policy", "--param": "params", "--mode": "mode",
          "--task-iterations": "task_iterations", "--restart-cost": "restart_cost_s",
          "--throughputs": "profiles", "--cluster": "cluster"}


def _api_error(e: InputError) -> InputError:
    """The same error, named by the keyword argument instead of the command-line flag."""
    message = e.message.replace("pass --skip-unplaceable", "pass skip_unplaceable=True")
    for flag, kw in _FLAGS.items():  # "pass --cluster cluster.yaml" -> "pass cluster=..."
        message = message.replace(f"pass {flag} ", f"pass {kw}=")
    return type(e)(_FLAGS.get(e.source, e.source), message, e.where)


def plan(jobs: str | Path | Mapping[str, Any] | Sequence[Job | Mapping[str, Any]],
         cluster: str | Path | Mapping[str, Any] | Cluster | None = None,
         profiles: str | Path | Sequence[ProfileRow | Mapping[str, Any]] | ThroughputTable
         | None = None, *, policy: str = "auto", params: dict[str, Any] | None = None,
         mode: str = "space", static: bool = False, restart_cost_s: float | None = None,
         task_iterations: int | None = None, partition: str | None = None,
         skip_unplaceable: bool = False, state: str | Path | None = None) -> Plan:
    """Plan ``jobs`` on ``cluster`` (``hetsched plan``); see docs/policies.md for policies.

    Each input is a path (YAML, CSV), a dict (the file's content) or the
    loaded objects. As on the command line, no ``cluster`` reads ``partition`` (or the
    configured one) from Slurm, no ``profiles`` reads the profile history of the state
    file, ``restart_cost_s`` None is the configured one, and the completed jobs'
    progress history is read where the policy or a ``target_loss`` job needs it: the
    same inputs give the same plan as ``hetsched plan``. ``skip_unplaceable``: plan the
    jobs that fit and list the others (the plan's ``skipped_unplaceable``) instead of
    refusing the batch. ``state``: the state file whose histories are read (default: the
    configured one, as :func:`submit`'s ``state``); it is only read. Errors name the
    argument (``policy: unknown policy ...``).
    """
    from hetsched.app.plan import (
        PlanInputs,
        load_throughputs,
        plan_jobs,
        plan_settings,
        progress_history,
    )
    from hetsched.app.plan import load_cluster as cluster_or_partition
    from hetsched.state.store import open_store_readonly

    store = None
    try:
        settings = plan_settings(mode=mode, policy=policy, params=params, static=static,
                                 restart_cost_s=restart_cost_s,
                                 task_iterations=task_iterations)
        js = _jobs(jobs)
        if state is not None:
            store = open_store_readonly(state)
            if store is None and profiles is None:
                raise InputError("state", f"no state file at {state}, so no profile history; "
                                 "pass profiles=profiles.csv or run `hetsched profile`")
        inputs = PlanInputs(
            js, cluster_or_partition(None, partition) if cluster is None else _cluster(cluster),
            load_throughputs(None, store) if profiles is None else load_profiles(profiles),
            progress_history(settings.policy, js, store) if store is not None or state is None
            else None, "jobs")
        return plan_jobs(inputs, settings, skip_unplaceable=skip_unplaceable)
    except InputError as e:
        raise _api_error(e) from None
    finally:
        if store is not None:
            store.close()


class JobHandle:
    """One submitted job, as submitit's ``Job``: its state, waiting, cancelling, its log.

    Every call asks Slurm (one ``squeue``) and reads the state file; nothing is
    cached. A job of a pool or a co-location group shares its Slurm job with
    the others (``slurm_id``); cancelling it drops it as ``hetsched cancel`` does.
    """

    def __init__(self, name: str, slurm_id: str, state_path: Path, client: Any) -> None:
        self.name = name
        self.slurm_id = slurm_id
        self.state_path = state_path
        self.client = client

    def __repr__(self) -> str:
        return f"JobHandle({self.name!r}, slurm_id={self.slurm_id!r})"

    def _status(self) -> Any:
        from hetsched.app.status import batch_status
        from hetsched.state.store import open_store

        with open_store(self.state_path) as st:
            for j in batch_status(st, self.client, all_batches=True):
                if j.job == self.name:
                    return j
        raise InputError("job", f"{self.name!r} is not in {self.state_path}")

    @property
    def state(self) -> str:
        """Slurm's state now (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...); a
        pool job is COMPLETED once its executors recorded its end, while its pool's
        Slurm job may run on for the others."""
        return str(self._status().state)

    def done(self) -> bool:
        """Whether the job ended (completed, failed, cancelled, timed out...)."""
        return self.state not in _ACTIVE

    def wait(self, timeout_s: float | None = None, poll_s: float = 5.0) -> str:
        """Block until the job ended; its final state. TimeoutError after ``timeout_s``.

        A replan that resubmits the job gives it a new Slurm id; the handle
        follows the job by name, so ``wait`` waits for the job, not one id.
        """
        import time

        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            st = self.state
            if st not in _ACTIVE:
                return st
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"job {self.name} still {st} after {timeout_s:g} s")
            time.sleep(poll_s if end is None else max(0.0, min(poll_s, end - time.monotonic())))

    def cancel(self, reason: str = "") -> None:
        """Cancel the job for good (``hetsched cancel JOB``; a pool job is dropped)."""
        from hetsched.app.cancel import cancel_jobs
        from hetsched.state.store import open_store

        with open_store(self.state_path) as st:
            cancel_jobs(st, self.client, [self.name], reason=reason, user=None)

    def log_path(self) -> Path | None:
        """The Slurm output file (``%x-%j.out``), None before Slurm created it."""
        from hetsched.app.status import failed_log
        from hetsched.state.store import open_store

        with open_store(self.state_path) as st:
            sid = self._status().slurm_id
            found = failed_log(st, sid)
        return Path(found) if found else None

    def stdout(self) -> str:
        """The job's output so far ('' before it started). Slurm writes stdout and stderr
        of hetsched's jobs to one file (``--output``), so this is both, interleaved."""
        p = self.log_path()
        return p.read_text(errors="replace") if p is not None else ""

    def stderr(self) -> str:
        """The job's error output. hetsched's jobs send stderr to the same file as stdout
        (one ``--output`` per job, as Slurm does without ``--error``), so this is that
        file: a traceback is at its end."""
        return self.stdout()

    def result(self) -> dict[str, Any]:
        """What was measured beside what was predicted (``hetsched status --format json``)."""
        from dataclasses import asdict

        return asdict(self._status())


_ACTIVE = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                     "REQUEUED", "REQUEUE_HOLD", "SUBMITTING", "SUBMITTED", "RESIZING"})


class Batch:
    """What :func:`submit` returns: a handle per job (``batch["name"]``, ``iter(batch)``),
    ``wait()``/``cancel()`` for all, and the submit result's fields (``submitted``,
    ``scripts``, ``plan_id``...)."""

    def __init__(self, result: Any, jobs: dict[str, JobHandle]) -> None:
        self.result = result
        self.jobs = jobs

    def __getattr__(self, name: str) -> Any:
        if name in ("result", "jobs"):
            raise AttributeError(name)
        return getattr(self.result, name)

    def __getitem__(self, name: str) -> JobHandle:
        return self.jobs[name]

    def __iter__(self) -> Any:
        return iter(self.jobs.values())

    def __len__(self) -> int:
        return len(self.jobs)

    def states(self) -> dict[str, str]:
        return {n: h.state for n, h in self.jobs.items()}

    def wait(self, timeout_s: float | None = None, poll_s: float = 5.0) -> dict[str, str]:
        """Wait for every job; their final states."""
        import time

        end = None if timeout_s is None else time.monotonic() + timeout_s
        out = {}
        for n, h in self.jobs.items():
            left = None if end is None else max(0.0, end - time.monotonic())
            out[n] = h.wait(left, poll_s)
        return out

    def cancel(self, reason: str = "") -> None:
        """Cancel every job that is still queued or running."""
        from hetsched.app.cancel import cancel_jobs
        from hetsched.state.store import open_store

        live = [n for n, h in self.jobs.items() if not h.done()]
        if live:
            h = next(iter(self.jobs.values()))
            with open_store(h.state_path) as st:
                cancel_jobs(st, h.client, live, reason=reason)


def submit(plan: Plan | str | Path, *, dry_run: bool = False, partition: str | None = None,
           state: str | Path | None = None, client: Any = None,
           sbatch: Mapping[str, Any] | None = None) -> Batch:
    """Submit ``plan`` (a Plan or a plan.json path) to Slurm (``hetsched submit``).

    Returns a :class:`Batch`: a :class:`JobHandle` per submitted job
    (``.state``, ``.wait()``, ``.cancel()``, ``.stdout()``, ``.stderr()``,
    ``.result()``), plus the submit result's ``submitted`` (job, Slurm id)
    pairs and rendered ``scripts``. With ``dry_run`` only the scripts are
    rendered and there are no handles. ``client`` is the Slurm client
    (default: Slurm's commands, as the command line uses). ``sbatch``: options for every
    job, the keys of a jobs file's ``slurm:`` (``time``, ``account``, ``qos``, ``mem``,
    ``cpus_per_gpu``, ``constraint``, ``extra``), as ``hetsched submit``'s flags: over
    the configured ones, under each job's own.
    """
    from hetsched.app.submit import base_sbatch
    from hetsched.app.submit import submit as submit_plan
    from hetsched.core.sbatch import SbatchOptionError, SbatchOptions

    if isinstance(plan, (str, Path)):
        plan = load_plan(plan)
    try:
        opts = base_sbatch(SbatchOptions.parse(dict(sbatch or {})))
    except SbatchOptionError as e:
        raise InputError("sbatch", str(e)) from None
    if dry_run:
        return Batch(submit_plan(plan, None, None, dry_run=True, partition=partition,
                                 source="api", sbatch=opts), {})
    from hetsched.state.store import open_store

    if client is None:
        from hetsched.slurm.client import make_client

        client, _ = make_client()
    with open_store(Path(state) if state is not None else None) as st:
        res = submit_plan(plan, st, client, partition=partition, source="api", sbatch=opts)
        path = Path(st.path)
    return Batch(res, {job: JobHandle(job, sid, path, client)
                       for job, sid in res.submitted + res.skipped})


__all__ = ["Batch", "Cluster", "Job", "JobHandle", "Plan", "ProfileRow", "ThroughputTable",
           "load_cluster", "load_jobs", "load_plan", "load_profiles", "plan", "save_plan",
           "submit"]
