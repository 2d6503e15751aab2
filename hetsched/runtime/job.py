"""``hetsched run``: turn (plan, job) plus this process's environment into a training rank.

Torch-free until the rank actually trains, so ``command`` mode (which
``exec``s the user's program) never pays for importing torch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hetsched import config
from hetsched.core.plan import worker_groups
from hetsched.core.spec import Job
from hetsched.errors import InputError
from hetsched.io.files import check_private
from hetsched.io.jobfiles import JobFiles, files_root
from hetsched.io.layout import Layout, read_layout
from hetsched.io.plan_json import load_plan
from hetsched.runtime.environment import JobEnvironment
from hetsched.runtime.launcher import RankEnv, from_env, local_batches_for, spawn_local


def load_plan_job(plan_path: str, job: str, segment: int = 0) -> tuple[Job,
                                                                        list[dict[str, Any]]]:
    """The job's spec (validated when the plan was loaded) and the segment's workers in
    rank order (the template's order)."""
    spec, ordered, _ = _plan_job(plan_path, job, segment)
    return spec, ordered


def _plan_job(plan_path: str, job: str, segment: int = 0
              ) -> tuple[Job, list[dict[str, Any]], JobFiles]:
    """:func:`load_plan_job` and the job's files (checkpoint, report: io/jobfiles.py)."""
    check_private(plan_path, "plan")
    plan = load_plan(plan_path)
    jobs = {j.name: j for j in plan.jobs}
    if job not in jobs:
        raise InputError(plan_path, f"no job {job!r} in the plan (jobs: "
                         f"{', '.join(sorted(jobs)) or 'none'})", "--job")
    j = jobs[job]
    if not 0 <= segment < len(j.segments):
        raise InputError(plan_path, f"job {job!r} has no segment {segment} "
                         f"(it has {len(j.segments)})", "--segment")
    ordered: list[dict[str, Any]] = []
    for gpu_type, node, batches in worker_groups(j.segments[segment].workers):  # the hetjob's rank order
        ordered.extend({"gpu_type": gpu_type, "node": node, "local_batch": b} for b in batches)
    return (_spec(j.spec, plan_path, job), ordered,
            JobFiles.in_step(plan_path, plan, job, segment))


def _spec(spec: Job | None, source: str, job: str) -> Job:
    """The job's typed spec (every loaded plan has one; a plan built in memory may not)."""
    if spec is None:
        raise InputError(source, "the plan has no spec for this job", f"job {job!r}")
    return spec


#: seconds a rank waits for the layout file to match its allocation: a replan
#: updates a pending job in Slurm first and rewrites its layout right after
LAYOUT_WAIT_S = 30.0


def layout_mismatch(layout: Layout, job: str, env: Mapping[str, str]) -> str:
    """Why ``layout`` does not fit this process's place in the Slurm step ('' if it does)."""
    if layout.job != job:
        return f"it is the layout of job {layout.job!r}"
    jenv = JobEnvironment.from_env(env)
    if "SLURM_PROCID" not in env:
        return ""  # not inside a Slurm step: nothing to check against
    renv = jenv.rank
    workers = layout.workers()
    if len(workers) != renv.world_size:
        return f"it has {len(workers)} ranks, the step has {renv.world_size} tasks"
    node = jenv.node
    want = workers[renv.rank]["node"]
    if layout.pinned and node and want != node:
        return f"it puts rank {renv.rank} on {want}, Slurm started it on {node}"
    return ""


def read_job_layout(path: str, job: str, env: Mapping[str, str], *,
                    wait_s: float = LAYOUT_WAIT_S,
                    sleep: Callable[[float], None] = time.sleep) -> Layout:
    """The job's layout, once it matches the allocation (re-read for up to ``wait_s``).

    A replan changes a pending job in Slurm (``scontrol update``) and then
    rewrites its layout file; a job that starts in between reads the old
    layout for the new allocation, so a mismatch is re-read before it fails.
    """
    deadline = time.monotonic() + wait_s
    while True:
        layout = read_layout(path)
        why = layout_mismatch(layout, job, env)
        if not why:
            return layout
        if time.monotonic() >= deadline:
            raise InputError(path, f"the layout does not match this job's allocation: {why} "
                             f"(still after {wait_s:g} s)", "--layout")
        sleep(1.0)


def build_config(spec: Job, workers: list[dict[str, Any]], world_size: int,
                 job: str, env: Mapping[str, str], overrides: Mapping[str, Any],
                 files: JobFiles | None = None) -> Any:
    """A TrainConfig from the plan's spec, the environment and command-line overrides;
    checkpoint and report at ``files`` (default: unscoped, under the configured roots)."""
    files = files or JobFiles(files_root(), "", job)
    from hetsched.runtime.trainer import TrainConfig

    batches = local_batches_for(world_size, env, [w["local_batch"] for w in workers])
    gb = spec.global_batch
    elastic = spec.elastic
    if elastic is not None:  # the planner chose this segment's batch within the job's range
        lo, hi = elastic.min_batch, elastic.max_batch
        if not lo <= sum(batches) <= hi:
            raise InputError("plan", f"local batches {batches} sum to {sum(batches)}, outside "
                             f"the job's elastic range [{lo}, {hi}]", f"job {job!r}")
    elif gb != sum(batches):
        raise InputError("plan", f"local batches {batches} sum to {sum(batches)}, the job's "
                         f"global_batch is {gb}", f"job {job!r}")
    jenv = JobEnvironment.from_env(env)
    gpu_types = list(jenv.gpu_types) or [w["gpu_type"] for w in workers]
    cfg = TrainConfig(
        job=job, workload=spec.workload, dataset_size=spec.dataset_size,
        epochs=float(spec.epochs), local_batches=batches,
        entrypoint=spec.entrypoint or jenv.entrypoint or None,
        workdir=spec.workdir,
        gpu_types=[t.lower() for t in gpu_types],
        seed=int(overrides.get("seed") or 0),
        checkpoint=str(overrides.get("checkpoint") or files.checkpoint),
        report=str(overrides.get("report") or files.report),
        lr_scaling=elastic.lr_scaling if elastic is not None else "none",
        base_batch=gb,
        report_every=max(1, int(config.get("report_every"))),
    )
    for k in ("checkpoint_every", "max_steps", "device", "save_params", "report_every"):
        if overrides.get(k) is not None:
            setattr(cfg, k, overrides[k])
    if overrides.get("epochs") is not None:
        cfg.epochs = float(overrides["epochs"])
    return cfg


def exec_command(argv: list[str], renv: RankEnv, local_batch: int, batches: list[int]) -> None:
    """``command`` mode: replace this process by the user's program, no shell.

    The program finds its place in the job in the environment: torchrun-style
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` and
    ``HETSCHED_LOCAL_BATCH`` (its share of the global batch),
    ``HETSCHED_GLOBAL_BATCH``, ``HETSCHED_LOCAL_BATCHES``.
    """
    env = dict(os.environ)
    env.update({"RANK": str(renv.rank), "WORLD_SIZE": str(renv.world_size),
                "LOCAL_RANK": str(renv.local_rank), "MASTER_ADDR": renv.master_addr,
                "MASTER_PORT": str(renv.master_port), "HETSCHED_RANK": str(renv.rank),
                "HETSCHED_LOCAL_BATCH": str(local_batch),
                "HETSCHED_GLOBAL_BATCH": str(sum(batches)),
                "HETSCHED_LOCAL_BATCHES": ",".join(map(str, batches))})
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        raise InputError("command", f"cannot run {argv[0]!r}: {e.strerror}") from None


#: the TrainConfig fields that are paths: made absolute before the rank enters its workdir
PATH_FIELDS = ("checkpoint", "report", "save_params", "rescale_request")


def enter_workdir(workdir: str | None, where: str, cfg: Any = None) -> None:
    """Run in the job's ``workdir`` (its command's relative paths, its code's data files),
    where Slurm started the step in whatever directory ``sbatch`` ran from (cron's is
    the home directory). ``cfg``'s paths are made absolute first."""
    if not workdir:
        return
    for key in PATH_FIELDS if cfg is not None else ():
        value = getattr(cfg, key, None)
        if value:
            setattr(cfg, key, os.path.abspath(value))
    try:
        os.chdir(workdir)
    except OSError as e:
        raise InputError(where, f"cannot enter the workdir {workdir!r}: {e.strerror}; it "
                         "must be a directory the job's nodes can reach") from None


def _local_command_main(argv: list[str], batches: list[int]) -> None:
    renv = from_env()
    exec_command(argv, renv, batches[renv.rank], batches)


def _local_rank_main(cfg: Any) -> None:
    from hetsched.runtime.trainer import train

    train(cfg, from_env())


def run(plan_path: str, job: str, *, segment: int | None = None, local: bool = False,
        overrides: Mapping[str, Any] | None = None,
        layout: str | None = None) -> dict[str, Any] | None:
    """Run this rank of ``job`` (or, with ``local``, every rank as local processes).

    ``layout`` (the hetjob passes it, io/layout.py) names the plan and segment
    and gives every rank's GPU type, node and local batch; it wins over
    ``plan_path`` and ``segment``: a replan may have changed the pending job in place.
    """
    jenv = JobEnvironment.from_env()
    env = jenv.env
    seg = segment if segment is not None else (jenv.segment or 0)
    if layout:
        lay = read_job_layout(layout, job, {} if local else env)
        spec, _, files = _plan_job(lay.plan, job, lay.segment)
        workers = lay.workers()
    else:
        spec, workers, files = _plan_job(plan_path, job, seg)
    overrides = dict(overrides or {})
    argv = [str(a) for a in spec.command] if spec.command and not spec.entrypoint else None
    if local:
        local_env = jenv.without("HETSCHED_LOCAL_BATCHES")
        shares = [w["local_batch"] for w in workers]
        target: Callable[..., None]
        args: tuple[Any, ...]
        if argv is not None:  # each rank execs the command, as in a Slurm step
            target, args = _local_command_main, (argv, local_batches_for(
                len(workers), local_env, shares))
            cfg = None
        else:
            cfg = build_config(spec, workers, len(workers), job, local_env, overrides, files)
            from hetsched.runtime.checkpoint import load_checkpoint

            load_checkpoint(cfg.checkpoint)  # a bad one: one line here, not one per rank
            target, args = _local_rank_main, (cfg,)
        here = os.getcwd()
        enter_workdir(spec.workdir, f"job {job!r}", cfg)
        try:  # the ranks start in the job's workdir; this process goes back to its own
            codes = spawn_local(len(workers), target, args)
        finally:
            os.chdir(here)
        if any(codes):
            raise RuntimeFailure(f"job {job!r}: local ranks exited with {codes}")
        return {"ranks": len(workers), "exit_codes": codes}
    renv = jenv.rank
    if argv is not None:
        batches = local_batches_for(renv.world_size, env, [w["local_batch"] for w in workers])
        enter_workdir(spec.workdir, f"job {job!r}")
        exec_command(argv, renv, batches[renv.rank], batches)
    cfg = build_config(spec, workers, renv.world_size, job, env, overrides, files)
    enter_workdir(spec.workdir, f"job {job!r}", cfg)
    from hetsched.runtime.trainer import train

    return train(cfg, renv)


class RuntimeFailure(InputError):
    """A rank of a local run failed (its traceback is on stderr)."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__("hetsched run", message)


# -- co-location groups (runtime/group.py) -----------------------------------------

def build_group_config(plan_path: str, group: str, world_size: int | None,
                       env: Mapping[str, str], overrides: Mapping[str, Any]) -> Any:
    """A GroupConfig: one TrainConfig per job of ``group``, local batches in the group's
    rank order (core.groups), checkpoints and reports at each job's usual paths."""
    from hetsched.core.groups import group_of
    from hetsched.runtime.group import GroupConfig

    check_private(plan_path, "plan")
    plan = load_plan(plan_path)
    view = group_of(plan, group, plan_path)
    world = len(view.slots) if world_size is None else world_size
    if world != len(view.slots):
        raise InputError(plan_path, f"group {group!r} shares {len(view.slots)} GPUs; the "
                         f"step runs {world} tasks (one per GPU)", "--group")
    # every job has its own local batches: the template's HETSCHED_LOCAL_BATCHES is not theirs
    jenv = JobEnvironment.from_env(env)
    job_env = jenv.without("HETSCHED_LOCAL_BATCHES")
    members = []
    for m in view.members:
        spec = plan.job(m.job).spec
        workers = [{"gpu_type": s.gpu_type, "node": s.node, "local_batch": b}
                   for s, b in zip(view.slots, m.local_batches, strict=True)]
        per_job = dict(overrides)
        for key in ("save_params", "trace_dir", "checkpoint", "report"):
            per_job.pop(key, None)
        cfg = build_config(_spec(spec, plan_path, m.job), workers, world, m.job,
                           job_env, per_job, JobFiles.in_step(plan_path, plan, m.job))
        if overrides.get("save_params_dir"):
            cfg.save_params = str(Path(str(overrides["save_params_dir"])) / f"{m.job}.pt")
        members.append(cfg)
    gpu_types = list(jenv.gpu_types) or [s.gpu_type for s in view.slots]
    budget = overrides.get("memory_budget_mb")
    return GroupConfig(group=group, members=members, gpu_types=[t.lower() for t in gpu_types],
                       device=overrides.get("device"),
                       memory_budget_mb=float(budget) if budget is not None else None,
                       trace_dir=overrides.get("trace_dir"))


def _local_group_main(cfg: Any) -> None:
    from hetsched.runtime.group import run_group

    run_group(cfg, from_env())


def run_group_job(plan_path: str, group: str, *, local: bool = False,
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Run this rank of a co-location group (or, with ``local``, every rank locally)."""
    overrides = dict(overrides or {})
    if local:
        cfg = build_group_config(plan_path, group, None, os.environ, overrides)
        from hetsched.runtime.checkpoint import load_checkpoint

        for m in cfg.members:
            load_checkpoint(m.checkpoint)  # a bad one: one line here, not one per rank
        codes = spawn_local(len(cfg.gpu_types), _local_group_main, (cfg,))
        if any(codes):
            raise RuntimeFailure(f"group {group!r}: local ranks exited with {codes}")
        return {"ranks": len(cfg.gpu_types), "exit_codes": codes}
    jenv = JobEnvironment.from_env()
    renv = jenv.rank
    cfg = build_group_config(plan_path, group, renv.world_size, jenv.env, overrides)
    from hetsched.runtime.group import run_group

    return run_group(cfg, renv)
