"""Submit a pool-mode plan: ONE heterogeneous Slurm job holding every GPU of the pool.

``app.submit.submit`` hands pool plans here. The guarantees are space mode's
(docs/slurm.md), for one ``sbatch``:

* **All or nothing.** The script is rendered before anything is written; if
  ``sbatch`` fails, any job carrying this plan's pool tag (a lost reply) is
  cancelled, the records are removed and the error quotes Slurm.
* **Idempotent.** One submission row per planned job (segment 0), all with
  the pool job's id, so ``status``, ``replan`` and the monitor see each job.
  The rows are written (state ``SUBMITTING``) *before* ``sbatch`` in one
  transaction and get the id right after; a re-run skips a submitted plan
  and, for rows without an id (a crash between the two), first looks for the
  tagged job in Slurm instead of submitting twice.

Where the executors write reports and checkpoints is fixed at submission
(``--report-dir``/``--checkpoint-dir`` in the script) and recorded beside the
plan copy (``STATE.files/pool/<plan_id>.json``) for ``status`` and ``replan``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hetsched.app.runnable import (
    BUILTIN_SAMPLE_BYTES,
    UnrunnableError,
    check_nodes_known,
    host_local_files,
    listing,
    unavailable_nodes,
)
from hetsched.app.submission import (
    Site,
    SubmitError,
    SubmitResult,
    base_sbatch,
    check_plan,
    files_dir,
    refuse_active_elsewhere,
    time_limit,
)
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptions, time_minutes
from hetsched.errors import HetschedError, InputError
from hetsched.io.files import atomic_write, private_dir
from hetsched.io.jobfiles import JobFiles, checkpoint_root, pool_sidecar, report_root
from hetsched.io.plan_json import dump_plan
from hetsched.io.secret import write_secret
from hetsched.slurm.client import SlurmClient
from hetsched.slurm.pool_script import pool_comment, pool_gpus, render_pool
from hetsched.slurm.runner import CommandError
from hetsched.state.store import SUBMITTING, SUPERSEDED, Store, Submission

#: the key of a pool plan's script in ``SubmitResult.scripts``
POOL_KEY = "pool"
#: the job name a pool plan's one hetjob has in its paths (io/jobfiles.py)
POOL_JOB = "pool"


@dataclass
class PoolSubmitResult(SubmitResult):
    """A submission result that also carries each GPU's task sequence (for --dry-run)."""

    sequences: list[str] = field(default_factory=list)
    slurm_id: str | None = None


@dataclass(frozen=True)
class PoolDirs:
    """Where a pool plan's executors write (fixed at submission)."""

    report_dir: Path
    checkpoint_dir: Path
    slurm_id: str | None = None


def _sidecar(store: Store, plan_id: str) -> Path:
    return pool_sidecar(files_dir(store), plan_id)


def _root(store: Store | None, files_base: Path | None = None) -> Path:
    """The files root; for a dry run without a state store, ``files_base`` (the state
    file's ``.files`` folder, so the script names the paths a real submit would)."""
    return files_dir(store) if store is not None else (files_base or Path("hetsched-files"))


def pool_default_dirs(store: Store | None, files_base: Path | None = None) -> PoolDirs:
    """The report and checkpoint roots (io/jobfiles.py); the plan id is a level below."""
    root = _root(store, files_base)
    return PoolDirs(report_root(root), checkpoint_root(root))


def pool_dirs(store: Store, plan_id: str) -> PoolDirs:
    """The directories recorded when ``plan_id`` was submitted (defaults if none)."""
    try:
        d = json.loads(_sidecar(store, plan_id).read_text())
        return PoolDirs(Path(d["report_dir"]), Path(d["checkpoint_dir"]), d.get("slurm_id"))
    except (OSError, ValueError, KeyError, TypeError):
        return pool_default_dirs(store)


def _write_sidecar(store: Store, plan_id: str, dirs: PoolDirs, slurm_id: str | None) -> None:
    atomic_write(_sidecar(store, plan_id), json.dumps({
        "plan_id": plan_id, "report_dir": str(dirs.report_dir),
        "checkpoint_dir": str(dirs.checkpoint_dir), "slurm_id": slurm_id}) + "\n")


def task_sequences(plan: Plan) -> list[str]:
    """Each GPU's task sequence, compact: one line per GPU, runs as the plan stores them.

    ``job r3.t1`` is task 1 of round 3; ``[a r0.t0, b r0.t1] x40 (+1 round)`` is
    that pattern repeated 40 times, rounds advancing by 1 each time.
    """
    tasks = plan.tasks
    out = ["task sequence per GPU (JOB rROUND.tTASK; [...] xK: the pattern K times)"]
    for g in pool_gpus(tasks):
        assert tasks is not None  # pool_gpus raised otherwise
        parts = []
        for run in tasks.gpu(g.node, g.index).runs:
            rows = ", ".join(f"{r.job} r{r.round}.t{r.task}" for r in run.rows)
            k = run.repeat
            if k > 1:
                step = run.round_step or 0
                parts.append(f"[{rows}] x{k} (+{step} round{'s' if step != 1 else ''})")
            else:
                parts.append(rows)
        out.append(f"GPU {g.gpu_id} ({g.gpu_type}, {g.tasks} tasks): {'; '.join(parts)}")
    return out


#: what ``hetsched exec`` can build without an entrypoint (runtime/workloads.py BUILTINS;
#: tests/slurm/test_pool_submit.py keeps the two in step without importing torch here)
EXECUTOR_WORKLOADS = frozenset(BUILTIN_SAMPLE_BYTES)


def not_poolable(plan: Plan) -> list[tuple[str, str]]:
    """[(job, why)] for jobs the pool executor cannot train (it builds the model itself)."""
    out = []
    for j in plan.jobs:
        spec = j.spec
        if spec is None:
            out.append((j.name, "the plan carries no job spec"))
        elif not spec.entrypoint and spec.workload not in EXECUTOR_WORKLOADS:
            out.append((j.name, f"workload {spec.workload!r} is not a built-in "
                        f"({', '.join(sorted(EXECUTOR_WORKLOADS))}) and the job has no "
                        "entrypoint" + ("; a command cannot run under the pool executor, "
                                        "use space mode" if spec.command else "")))
    return out


def pool_sbatch(plan: Plan, sbatch: SbatchOptions | None) -> tuple[SbatchOptions, int]:
    """The pool job's sbatch options and time limit (minutes).

    ``hetsched submit``'s options over the config's (``base_sbatch``); a job
    spec's own ``slurm:`` does not apply (one Slurm job runs every job). Without
    a ``time``, the limit comes from the plan's makespan (``time_limit``).
    """
    opts = sbatch if sbatch is not None else base_sbatch()
    limit = time_minutes(opts.time) if opts.time else time_limit(plan.makespan_s)[0]
    return opts, limit


def _site(client: SlurmClient, partition: str | None, limit: int, source: str,
          files: Path, pinned: Collection[str] = ()) -> Site:
    """The partition as Slurm reports it, for the pool job: refused when its limit is
    above MaxTime (the pool executor does not requeue itself, and Slurm would keep it
    pending for ever: PartitionTimeLimit); a warning when its files are where the
    nodes cannot read them, or when a node it is pinned to (``pinned``) is down or
    drained now."""
    nodes = client.nodes(partition)
    check_nodes_known(sorted(pinned), nodes, partition, "tasks", source)
    down = sorted(f"{n} ({state})" for n, state in unavailable_nodes(nodes).items()
                  if n in pinned)
    if down:
        logging.getLogger("hetsched").warning(
            "%s", f"the pool job runs on nodes Slurm shows unavailable now: {', '.join(down)}; "
            "it waits until they return: `hetsched replan` moves it (or plan again)")
    site = Site.of(client, partition, nodes)
    if site.max_time_min is not None and limit > site.max_time_min:
        raise InputError(source, f"the pool job needs a time limit of {limit} min, above "
                         f"{site.where}'s MaxTime of {site.max_time_min} min: Slurm would "
                         "keep it pending for ever (PartitionTimeLimit); submit it in space "
                         "mode (each job checkpoints and requeues itself at the limit) or "
                         "plan fewer jobs per pool", "time")
    note = host_local_files(files, nodes)
    if note:
        logging.getLogger("hetsched").warning("%s", note)
    return site


def submit_pool(plan: Plan, store: Store | None, client: SlurmClient | None, *,
                dry_run: bool = False, partition: str | None = None, pin_nodes: bool = True,
                source: str = "plan", allow_active_elsewhere: bool = False,
                progress: Callable[[str], None] | None = None,
                sbatch: SbatchOptions | None = None,
                files_base: Path | None = None) -> PoolSubmitResult:
    """Submit a pool-mode plan as one hetjob (see module doc)."""
    pid = check_plan(plan, source)
    bad = not_poolable(plan)
    if bad and not dry_run:
        raise UnrunnableError(source, f"{len(bad)} of {len(plan.jobs)} jobs cannot run under "
                              f"the pool executor: {listing(bad)}", "jobs")
    opts, limit = pool_sbatch(plan, sbatch)
    if dry_run:
        files = JobFiles(_root(store, files_base), pid, POOL_JOB)
        dirs = pool_default_dirs(store, files_base)
        script = render_pool(plan, pid, plan_path=files.plan_copy, key_file=files.secret,
                             log_dir=files.log_dir, report_dir=dirs.report_dir,
                             checkpoint_dir=dirs.checkpoint_dir, partition=partition,
                             pin_nodes=pin_nodes, sbatch=opts, time_min=limit)
        return PoolSubmitResult(pid, None, scripts={POOL_KEY: script},
                                sequences=task_sequences(plan))
    if store is None or client is None:
        raise HetschedError("submit needs a state store and a Slurm client (or --dry-run)")
    files = JobFiles(files_dir(store), pid, POOL_JOB)
    plan_path, log_dir = files.plan_copy, files.log_dir
    prior = pool_dirs(store, pid) if _sidecar(store, pid).exists() else pool_default_dirs(store)
    site = _site(client, partition, limit, source, files_dir(store),
                 {g.node for g in plan.tasks.gpus} if pin_nodes and plan.tasks else set())
    # render first: a bad value fails before anything is written or reaches Slurm
    script = render_pool(plan, pid, plan_path=plan_path, log_dir=log_dir,
                         key_file=files.secret, report_dir=prior.report_dir, checkpoint_dir=prior.checkpoint_dir,
                         partition=partition, pin_nodes=pin_nodes, sbatch=opts, time_min=limit,
                         gres_names=site.gres_names)
    jobs = [j for j in plan.jobs if j.segments]
    if not allow_active_elsewhere:
        refuse_active_elsewhere(store, client, pid, {j.name for j in jobs})
    result = PoolSubmitResult(pid, plan_path, scripts={POOL_KEY: script})
    rows = {j.name: store.submission(pid, j.name, 0) for j in jobs}
    done = [r for r in rows.values() if r is not None and r.slurm_id and r.state != SUPERSEDED]
    if done and len(done) == len(rows):
        result.skipped = [(n, r.slurm_id or "") for n, r in rows.items() if r is not None]
        result.slurm_id = done[0].slurm_id
        return result
    if any(r is not None and r.state == SUBMITTING and not r.slurm_id for r in rows.values()):
        found = _find_pool_job(client, pid)
        if found is not None:  # a crash after sbatch, before the id was recorded
            _record(store, rows, found)
            result.skipped = [(n, found) for n in rows]
            result.slurm_id = found
            return result
    private_dir(log_dir)
    if not plan_path.exists():
        atomic_write(plan_path, dump_plan(plan) + "\n")
    _write_sidecar(store, pid, prior, None)
    store.add_plan(plan.to_dict(), source=source)
    path = files.script
    atomic_write(path, script.text)
    with store.tx():  # every job's intent, or none
        subs = {j.name: store.begin_submission(
            pid, j.name, 0, script.sha256, str(path),
            [w.to_dict() for w in j.segments[0].workers]) for j in jobs}
    try:
        write_secret(files.secret)  # a fresh secret per submission (0600)
        jid = client.submit(path)
    except CommandError as e:
        _rollback(store, client, pid, list(subs.values()))
        raise SubmitError(f"sbatch failed for pool plan {pid}: {e}; nothing from this run "
                          "remains queued") from None
    _record(store, subs, jid)
    _write_sidecar(store, pid, prior, jid)
    result.submitted = [(n, jid) for n in subs]
    result.slurm_id = jid
    store.add_event("submitted", detail=json.dumps(
        {"plan_id": pid, "mode": "pool", "slurm_id": jid, "jobs": sorted(subs)}), handled=True)
    if progress:
        progress(f"submitted pool plan {pid} ({len(subs)} jobs on "
                 f"{len(pool_gpus(plan.tasks))} GPUs) as Slurm job {jid}")
    return result


def _record(store: Store, rows: Mapping[str, Submission | None], slurm_id: str) -> None:
    with store.tx():
        for r in rows.values():
            if r is not None:
                store.set_submitted(r.id, slurm_id)


def _find_pool_job(client: SlurmClient, pid: str) -> str | None:
    tag = pool_comment(pid)
    for j in client.jobs():
        if j.comment == tag and not j.finished and j.mine:
            return j.leader
    return None


def _rollback(store: Store, client: SlurmClient, pid: str, subs: list[Submission]) -> None:
    """Cancel a pool job a lost reply may have created; drop this call's rows."""
    ids: list[str] = []
    try:
        found = _find_pool_job(client, pid)
        ids = [found] if found else []
    except CommandError:
        pass
    if ids:
        client.cancel(ids)
    with store.tx():
        for s in subs:
            store.delete_submission(s.id)
    store.add_event("submit-rollback", detail=json.dumps({"plan_id": pid, "mode": "pool",
                                                          "cancelled": ids}), handled=True)
