"""Click commands for the runtime and the profiler (registered by ``hetsched/cli.py``).

``run`` (one rank of a planned job, or every rank locally with ``--local``),
``probe`` (the probe job's body), ``profile`` (submit probes for missing
(workload, GPU type) pairs) and the ``profiles`` group (list, export, import,
forget, refine; in ``cli/profiles.py``). torch is imported only inside ``run`` and
``probe``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import click

from hetsched import config
from hetsched.cli.options import format_option, partition_option, state_option
from hetsched.cli.profiles import profiles
from hetsched.errors import EXIT_FAILURE, InputError

# ---------------------------------------------------------------------------
# run


@click.command("run")
@click.option("--plan", "plan_path", type=click.Path(), required=True, help="Plan JSON (the hetjob passes it).")
@click.option("--job", default=None, help="Job name in the plan.")
@click.option("--group", default=None,
              help="Instead of --job: every job of this co-location group, one task per "
              "shared GPU (Harmony co-location).")
@click.option("--memory-budget-mb", type=click.FloatRange(min=0), default=None,
              help="--group: device memory the group's jobs may hold together; idle jobs "
              "beyond it are spilled to host memory and reloaded before their next "
              "computation [default: no limit].")
@click.option("--segment", type=click.IntRange(0), default=None,
              help="Plan segment (default: $HETSCHED_SEGMENT, else 0).")
@click.option("--layout", type=click.Path(dir_okay=False), default=None,
              help="The job's layout file (the hetjob passes it): which plan and segment, and "
              "each rank's GPU type, node and local batch, read at start (a replan may have "
              "changed the pending job in place). Wins over --plan/--segment.")
@click.option("--local", is_flag=True,
              help="Run every rank of the segment as local processes (tests, demos).")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint file (default: CHECKPOINTS/BATCH/JOB.pt, CHECKPOINTS being "
              "$HETSCHED_CHECKPOINT_DIR, else STATE.files/checkpoints, and BATCH the plan the "
              "job was first submitted with). An existing one is resumed.")
@click.option("--checkpoint-every", type=click.IntRange(1), default=None,
              help="Steps between checkpoints [default: 50].")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Report file (JSON lines) [default: "
              "REPORTS/BATCH/JOB.jsonl, REPORTS being $HETSCHED_REPORT_DIR, else "
              "STATE.files/reports].")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Override the job's epochs.")
@click.option("--max-steps", type=click.IntRange(1), default=None,
              help="Stop after this many steps in this run (resume later from the checkpoint).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Force the device (default: CUDA when torch sees a GPU; NCCL there, gloo on "
              "CPU).")
@click.option("--seed", type=int, default=0, show_default=True)
def run_cmd(plan_path: str, job: str | None, group: str | None,
            memory_budget_mb: float | None, segment: int | None, layout: str | None,
            local: bool, checkpoint: str | None, checkpoint_every: int | None,
            report: str | None, epochs: float | None, max_steps: int | None,
            device: str | None, seed: int) -> None:
    """Train one planned job: this rank inside a Slurm step (the hetjob's `srun`).

    Ranks are numbered across the hetjob's components; each takes its local
    batch from the --layout file (or HETSCHED_LOCAL_BATCHES, or the plan). Gradients are weighted by
    local batch, so a step equals one step on the whole global batch. Jobs
    with a `command` instead of an entrypoint/built-in workload get their
    rank's HETSCHED_LOCAL_BATCH in the environment and run without a shell.

    With --group, this task trains every job of the plan's co-location group
    on its GPU: one computation at a time, another job's all-reduce meanwhile.
    """
    if (job is None) == (group is None):
        raise InputError("hetsched run", "give exactly one of --job and --group")
    if group is not None:
        if checkpoint or report:
            raise InputError("hetsched run", "--checkpoint and --report name one job's "
                             "files; a group's jobs use their own (CHECKPOINTS/BATCH/JOB.pt, "
                             "REPORTS/BATCH/JOB.jsonl: see --checkpoint, --report)")
        from hetsched.runtime.job import run_group_job

        res = run_group_job(plan_path, group, local=local, overrides={
            "checkpoint_every": checkpoint_every, "epochs": epochs, "max_steps": max_steps,
            "device": device, "seed": seed, "memory_budget_mb": memory_budget_mb})
        if res and (local or res.get("rank") == 0):
            click.echo(json.dumps(res, default=str), err=True)
        _rank_done(local)
        return
    assert job is not None
    from hetsched.runtime.job import run

    res = run(plan_path, job, segment=segment, local=local, layout=layout, overrides={
        "checkpoint": checkpoint, "checkpoint_every": checkpoint_every, "report": report,
        "epochs": epochs, "max_steps": max_steps, "device": device, "seed": seed})
    if res and (local or res.get("rank") == 0):
        click.echo(json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                               for k, v in res.items()}), err=True)
    _rank_done(local)


def _rank_done(local: bool) -> None:
    """A Slurm step's rank (``run``, ``exec``) that finished ends here, without the
    interpreter's teardown (runtime/launcher.py: exit_rank); ``--local`` returns, its
    ranks ended that way."""
    if not local:
        from hetsched.runtime.launcher import exit_rank

        exit_rank(0)


# ---------------------------------------------------------------------------
# exec


@click.command("exec")
@click.option("--plan", "plan_path", type=click.Path(), required=True, help="Pool plan JSON (the pool job passes it).")
@click.option("--gpu", "gpu", default=None,
              help="This executor's plan GPU id NODE-gINDEX (default: $HETSCHED_POOL_GPUS"
              "[rank], else the plan's GPU order).")
@click.option("--local", is_flag=True,
              help="Run every GPU's executor as a local process on this machine (tests, demos).")
@click.option("--report-dir", type=click.Path(file_okay=False), default=None,
              envvar="HETSCHED_REPORT_DIR", show_envvar=True, help="Reports go to DIR/PLAN_ID/gpu-GPU.jsonl "
              "[default: $HETSCHED_REPORT_DIR, else STATE.files/reports].")
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              envvar="HETSCHED_CHECKPOINT_DIR", show_envvar=True, help="Checkpoints: DIR/PLAN_ID/JOB.pt, one per "
              "job at round boundaries; existing ones are resumed [default: "
              "$HETSCHED_CHECKPOINT_DIR, else STATE.files/checkpoints].")
@click.option("--checkpoint-every", "checkpoint_every_s", type=click.FloatRange(min=0),
              default=0.0, show_default=True,
              help="Seconds between a job's checkpoints: at the first round boundary after "
              "them (0: every round; a job's last round always).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Force the device (default: CUDA when torch sees a GPU).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-residency", is_flag=True,
              help="Ignore the plan's speculative memory plan: evict every model after its "
              "task (for comparison).")
@click.option("--key-file", type=click.Path(dir_okay=False), default=None,
              envvar="HETSCHED_POOL_KEY_FILE", show_envvar=True,
              help="The pool job's secret (0600), written by `hetsched submit`; every "
              "executor proves it to the coordinator. --local makes its own.")
def exec_cmd(plan_path: str, gpu: str | None, local: bool, report_dir: str | None,
             checkpoint_dir: str | None, checkpoint_every_s: float, device: str | None,
             seed: int, no_residency: bool, key_file: str | None) -> None:
    """Run a pool plan's task sequences: this GPU's executor inside a Slurm step.

    `srun` starts one executor per pool GPU; rank 0 also runs the coordinator
    (one parameter server per job: a round's tasks, wherever they ran, make one
    optimizer step weighted by slice size). Models switch fast: kept in pinned
    host memory, loaded layer by layer while the forward pass runs, kept on
    the GPU when the plan says they come back, zeroed before another job runs.
    If an executor dies, every executor exits with status 3 and one line.
    Exit 2 for a bad plan or key file, 11 when the plan or key file is one
    another user could have written.
    """
    from hetsched.runtime.executor.entry import run_local, run_rank, with_default_dirs

    opts = with_default_dirs({"gpu": gpu, "report_dir": report_dir, "checkpoint_dir": checkpoint_dir,
                         "checkpoint_every_s": checkpoint_every_s,
                         "device": device, "seed": seed, "residency": not no_residency,
                         "local": local, "key_file": key_file})
    if local:
        codes = run_local(plan_path, opts)
        if any(codes):
            from hetsched.runtime.executor.entry import FAILED_EXIT

            click.echo(f"hetsched: error: exec --local: executors exited with {codes}", err=True)
            raise SystemExit(FAILED_EXIT)
        click.echo(json.dumps({"executors": len(codes), "exit_codes": codes}), err=True)
        return
    res = run_rank(plan_path, opts)
    click.echo(json.dumps(res), err=True)
    _rank_done(local)


# ---------------------------------------------------------------------------
# probe


@click.command("probe")
@click.option("--workload", required=True, help="Workload key (a built-in, or with --entrypoint).")
@click.option("--gpu-type", required=True, help="GPU type the rows are recorded under.")
@click.option("--batches", required=True, help="Local batch sizes to sweep, e.g. 8,16,32,64.")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="CSV to write (throughput format).")
@click.option("--entrypoint", default=None, help="module:function building the workload.")
@click.option("--workdir", type=click.Path(file_okay=False), default=None,
              help="Run in this directory and import the entrypoint's module from it first "
              "(the job's workdir; `hetsched profile` passes it).")
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=5, show_default=True,
              help="Timed steps per batch size, at least; more where they take under "
              "0.2 s together (their mean is kept).")
@click.option("--time-limit", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds; stop the sweep with what was measured so far.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None)
@click.option("--max-batch", type=click.IntRange(1), default=4096, show_default=True,
              help="GPU: upper bound of the search for the largest batch that fits.")
@click.option("--sync/--no-sync", default=True, show_default=True,
              help="Also measure the gradient all-reduce time.")
def probe_cmd(workload: str, gpu_type: str, batches: str, out: str, entrypoint: str | None,
              workdir: str | None, warmup: int, steps: int, time_limit: float | None,
              device: str | None, max_batch: int, sync: bool) -> None:
    """Measure a workload's step time over local batch sizes on this GPU (a probe job's body)."""
    from hetsched.app.profile import parse_batches, rows_to_csv_file
    from hetsched.runtime.probe import probe

    out = os.path.abspath(out)
    if workdir:
        from hetsched.runtime.job import enter_workdir

        workdir = os.path.abspath(workdir)
        enter_workdir(workdir, "--workdir")
    res = probe(workload, gpu_type, parse_batches(batches), entrypoint=entrypoint,
                warmup=warmup, steps=steps, device=device, time_limit_s=time_limit,
                max_batch=max_batch, sync=sync, workdir=workdir)
    if not res.rows:
        raise InputError("hetsched probe", f"nothing measured for {workload} on {gpu_type} "
                         f"(OOM at {res.oom_at})" if res.oom_at else "nothing measured")
    rows_to_csv_file(res.rows, Path(out))
    click.echo(f"{workload} on {gpu_type} ({res.device}): {len(res.rows)} batch sizes, "
               f"max batch {res.max_batch}, {res.elapsed_s:.1f} s", err=True)


# ---------------------------------------------------------------------------
# profile


@click.command("profile")
@click.argument("jobs_file", metavar="JOBS.yaml", type=click.Path())
@partition_option("Partition whose GPU types are probed (default: the `partition` setting).")
@click.option("--cluster", "cluster_file", type=click.Path(), default=None,
              help="Cluster YAML instead of asking Slurm which GPU types exist.")
@state_option
@click.option("--dry-run", is_flag=True, help="Print the probe scripts; submit nothing.")
@click.option("--batches", default=None,
              help="Local batch sweep (default: powers of two up to each job's global batch).")
@click.option("--time-limit", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds a probe may run before it is cancelled (pair marked unusable).")
@click.option("--queue-wait", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds a probe may wait in the queue before it is cancelled "
              "(nothing recorded for its pair: the next profile probes it again).")
@click.option("--warmup", type=click.IntRange(0), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1), default=5, show_default=True)
@click.option("--force", is_flag=True, help="Probe even pairs that have history.")
@click.option("--retry-unusable", is_flag=True, help="Probe again pairs marked unusable.")
@format_option("table", "json")
def profile_cmd(jobs_file: str, partition: str | None, cluster_file: str | None,
                state_path: str | None, dry_run: bool, batches: str | None, time_limit: float,
                queue_wait: float, warmup: int, steps: int, force: bool, retry_unusable: bool,
                fmt: str) -> None:
    """Probe every (workload, GPU type) of JOBS.yaml that has no usable profile history.

    One short probe job per pair, submitted through Slurm to that GPU type;
    they run concurrently. A failed or timed-out probe marks its pair
    unusable (the planner leaves that GPU type out for that workload) and
    does not fail the others. A probe whose job code or data did not load
    (`hetsched probe` exited 2: an entrypoint that does not import, ...) says
    nothing about the GPU type: nothing is recorded, and profile exits 1.
    Results go into the state store's profile history, which `hetsched
    profiles list|export|forget` manage.

    Ctrl-C (SIGINT), SIGTERM or SIGHUP (a dropped ssh session) cancels the probes
    still queued or running and records those that finished; exit 130, 143 or
    129. The next profile probes the rest.
    """
    from hetsched.app.probe_run import run_probes
    from hetsched.app.profile import (
        nothing_to_probe,
        parse_batches,
        plan_probes,
        render_probes,
    )
    from hetsched.app.submit import files_dir
    from hetsched.cli import logs
    from hetsched.io.specs import load_cluster, load_jobs
    from hetsched.state.store import open_store

    jobs = load_jobs(jobs_file)
    part = partition or config.get("partition") or None
    client = None
    names: dict[str, str] | None = None  # GPU types as Slurm spells them
    if cluster_file:
        types = list(load_cluster(cluster_file).gpu_types)
    else:
        from hetsched.slurm.client import CliSlurmClient
        from hetsched.slurm.inventory import load_inventory

        client = CliSlurmClient()
        inv = load_inventory(client, part)
        types, names = list(inv.cluster.gpu_types), inv.gres_names
    sweep = parse_batches(batches) if batches else None
    if dry_run:
        _profile_dry_run(jobs, types, state_path, sweep, part, time_limit, warmup, steps,
                         force=force, retry_unusable=retry_unusable, gres_names=names)
        return
    with open_store(state_path) as st:
        specs, skipped = plan_probes(jobs, types, st, batches=sweep, force=force,
                                     retry_unusable=retry_unusable, warn=_warn)
        for label, why in sorted(skipped.items()):
            click.echo(f"skip {label}: {why}", err=True)
        if not specs:
            if fmt == "json":
                click.echo(json.dumps({"wall_s": 0.0, "probes": []}, indent=2))
            else:
                click.echo(nothing_to_probe(skipped))
            return
        if client is None:
            from hetsched.slurm.client import CliSlurmClient, type_names

            client = CliSlurmClient()
            names = type_names(client.nodes(part))
        t0 = time.monotonic()
        outs = render_probes(specs, files_dir(st), partition=part, time_limit_s=time_limit,
                             warmup=warmup, steps=steps, gres_names=names,
                             cpus=_cpus_per_gpu())
        from hetsched.cli.progress import RichReporter

        with RichReporter(live=False if logs.quiet() else None) as rep:
            outs = run_probes(outs, client, st, time_limit_s=time_limit,
                              queue_wait_s=queue_wait, reporter=rep,
                              progress=None if logs.quiet() else rep.line)
        wall = time.monotonic() - t0
    _say_probes(outs, wall, fmt)


def _say_probes(outs: list[Any], wall: float, fmt: str) -> None:
    """What ``profile`` prints at the end: each probe's outcome (json), or one line.
    Exit 1 when a probe did not load the job's code or data: the user must fix it."""
    from hetsched.app.profile import NOT_LOADED, probes_summary

    if fmt == "json":
        click.echo(json.dumps({"wall_s": round(wall, 3), "probes": [
            {"workload": o.spec.workload, "gpu_type": o.spec.gpu_type, "status": o.status,
             "slurm_id": o.slurm_id, "reason": o.reason, "rows": len(o.rows),
             "seconds": None if o.seconds is None else round(o.seconds, 3)} for o in outs]},
            indent=2))
    else:
        click.echo(probes_summary(outs, wall))
    if any(o.status == NOT_LOADED for o in outs):
        raise SystemExit(EXIT_FAILURE)


def _warn(message: str) -> None:
    logging.getLogger("hetsched.profile").warning("%s", message)


def _cpus_per_gpu() -> int:
    """The config's CPU cores per GPU (``sbatch_cpus_per_gpu``), 0 when unset (the
    partition's default applies)."""
    from hetsched.app.submission import base_sbatch

    return base_sbatch().cpus_per_gpu or 0


def _profile_dry_run(jobs: list[Any], types: list[str], state_path: str | None,
                     sweep: tuple[int, ...] | None, part: str | None, time_limit: float,
                     warmup: int,
                     steps: int, *, force: bool, retry_unusable: bool,
                     gres_names: dict[str, str] | None = None) -> None:
    """``profile --dry-run``: print the probe scripts that would be submitted."""
    import tempfile

    from hetsched.app.profile import plan_probes, render_probes
    from hetsched.state.store import Store, default_path, open_store

    path = Path(state_path) if state_path else default_path()
    st: Store | None = open_store(path) if path.exists() else None
    try:
        specs, skipped = plan_probes(jobs, types, st, batches=sweep, force=force,
                                     retry_unusable=retry_unusable, warn=_warn)
    finally:
        if st is not None:
            st.close()
    with tempfile.TemporaryDirectory() as tmp:
        outs = render_probes(specs, Path(tmp), partition=part, time_limit_s=time_limit,
                             warmup=warmup, steps=steps, gres_names=gres_names,
                             cpus=_cpus_per_gpu())
        for o in outs:
            assert o.script is not None
            click.echo(f"# ---- probe {o.spec.workload} on {o.spec.gpu_type} ----")
            click.echo(o.script.read_text(), nl=False)
    for label, why in sorted(skipped.items()):
        click.echo(f"# skip {label}: {why}", err=True)
    click.echo(f"# dry run: {len(specs)} probes; nothing submitted", err=True)



COMMANDS = (run_cmd, exec_cmd, probe_cmd, profile_cmd, profiles)
