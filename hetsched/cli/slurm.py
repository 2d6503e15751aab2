"""Click commands for the Slurm side of hetsched: the batch's life in the queue.

Standalone click objects, registered by ``hetsched/cli/main.py`` with
``main.add_command(...)``: ``submit``, ``status``, ``watch``, ``cancel``,
``replan`` (``testbed`` and ``cluster`` are in ``cli/testbed.py``). They parse options, call the library and
render; errors are HetschedError subclasses that the main entry point prints
as one line with their exit code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hetsched import config
from hetsched.cli import logs
from hetsched.cli.options import format_option, needs_extra, partition_option, state_option
from hetsched.core.sbatch import MAX_CPUS_PER_GPU
from hetsched.errors import InputError

if TYPE_CHECKING:  # the use cases load when a command runs, not for --help (cli/main.py)
    from hetsched.app.status import JobStatus
    from hetsched.core.plan import Plan, PlanSettings
    from hetsched.core.sbatch import SbatchOptions
    from hetsched.slurm.client import CliSlurmClient
    from hetsched.state.store import Store

# ---------------------------------------------------------------------------
# shared by the Slurm commands


def _client(backend: str = "cli") -> CliSlurmClient:
    """The Slurm client for CLI commands (reads SLURM_CONF from the environment)."""
    from hetsched.slurm.client import make_client
    from hetsched.slurm.runner import Runner

    client, note = make_client(Runner(), backend)
    if backend != "cli":
        click.echo(note, err=True)
    return client


def _partition(partition: str | None) -> str | None:
    return partition or config.get("partition") or None


# ---------------------------------------------------------------------------
# submit


def _store(path: str | None) -> Store:
    from hetsched.state.store import open_store

    return open_store(path)




def load_plan_input(path: str, settings: PlanSettings, *, throughputs: str | None,
                    cluster_file: str | None, partition: str | None,
                    skip_unplaceable: bool = False) -> Plan:
    """A typed plan from plan.json, or from jobs.yaml planned first (app/plan.py: as
    ``hetsched plan`` would, with ``settings``)."""
    if Path(path).suffix.lower() in (".yaml", ".yml"):
        from hetsched.app.plan import plan_jobs_file

        return plan_jobs_file(path, settings, cluster_file=cluster_file,
                              partition=_partition(partition), tp_file=throughputs,
                              skip_unplaceable=skip_unplaceable,
                              warn=lambda m: click.echo(m, err=True))[0]
    from hetsched.io.plan_json import load_plan

    return load_plan(path)


def _cli_sbatch(**opts: object) -> SbatchOptions:
    """``hetsched submit``'s sbatch options, validated (the error names the option)."""
    from hetsched.core.sbatch import SbatchOptionError, SbatchOptions

    try:
        return SbatchOptions.parse({k: v for k, v in opts.items() if v is not None})
    except SbatchOptionError as e:
        raise InputError(f"--{'sbatch-option' if e.key == 'extra' else e.key}", str(e)) from None


@click.command("submit")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the sbatch scripts; touch neither Slurm "
              "nor the state file.")
@state_option
@partition_option("Partition for the jobs. Default: $HETSCHED_PARTITION, else Slurm's default.")
@click.option("--pin-nodes/--any-node", default=True, show_default=True,
              help="Pin each component to the plan's node (--nodelist), or let Slurm pick "
              "any node with that GPU type.")
@click.option("--throughputs", default=None, type=click.Path(dir_okay=False),
              help="Profiles CSV for planning a jobs.yaml (default: the profile history).")
@click.option("--policy", default="auto", show_default=True,
              help="Policy for planning a jobs.yaml.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Policy parameter for planning a jobs.yaml, repeatable.")
@click.option("--mode", type=click.Choice(["space", "pool", "auto"]), default="space",
              show_default=True, help="Sharing mode for planning a jobs.yaml (as `plan --mode`).")
@click.option("--static", is_flag=True, help="Planning a jobs.yaml: keep each job's first "
              "placement (as `plan --static`).")
@click.option("--restart-cost", type=click.FloatRange(min=0), default=None,
              help="Planning a jobs.yaml: seconds a running job loses when its GPUs change "
              "(default: the restart_cost_s setting).")
@click.option("--task-iterations", type=click.IntRange(min=1), default=None,
              help="Planning a jobs.yaml in pool mode: iterations per task (a round's "
              "tasks accumulate them into one optimizer step).")
@click.option("--cluster", "cluster_file", default=None, type=click.Path(dir_okay=False),
              help="Cluster YAML for planning a jobs.yaml (default: the Slurm partition).")
@click.option("--time", "-t", "time_", default=None, help="Time limit for every job (Slurm format); "
              "default: predicted duration x time_margin + time_pad_s.")
@click.option("--account", "-A", default=None, help="Slurm account (--account).")
@click.option("--qos", "-q", default=None, help="Slurm QoS (--qos).")
@click.option("--mem", default=None, help="Memory per node (--mem), e.g. 64G.")
@click.option("--cpus-per-gpu", "cpus_per_gpu", type=click.IntRange(1, MAX_CPUS_PER_GPU),
              default=None,
              help="CPU cores for each GPU (each rank's --cpus-per-task); default: the "
                   "partition's (DefCpuPerGPU, else one).")
@click.option("--constraint", "-C", default=None, help="Node features (--constraint).")
@click.option("--skip-unplaceable", is_flag=True,
              help="Leave out the jobs that cannot be placed (planning a jobs.yaml) or would "
              "fail where they run (no command/entrypoint/built-in); list them on stderr.")
@click.option("--parsable", is_flag=True,
              help="Print only the Slurm job ids, one per line (as sbatch --parsable).")
@click.option("--sbatch-option", "extra", multiple=True,
              help="Extra sbatch option for every job, e.g. --sbatch-option=--exclusive "
              "(repeatable).")
def submit_cmd(plan_file: str, dry_run: bool, state_path: str | None, partition: str | None,
               pin_nodes: bool, throughputs: str | None, policy: str,
               params: tuple[str, ...], mode: str, static: bool, restart_cost: float | None,
               task_iterations: int | None, cluster_file: str | None, time_: str | None, account: str | None,
               qos: str | None, mem: str | None, cpus_per_gpu: int | None,
               constraint: str | None, skip_unplaceable: bool, parsable: bool, extra: tuple[str, ...]) -> None:
    """Submit PLAN_FILE (plan.json, or jobs.yaml planned first) to Slurm as hetjobs.

    Each job's first segment becomes one heterogeneous job: one component per
    (GPU type, node) group with --gres=gpu:TYPE:N and one srun step across
    them. All or nothing: if an sbatch fails, what this run submitted is
    cancelled. Re-running after a crash does not submit twice; a plan whose
    jobs all ran and left the queue runs again as a new batch (plan id PID.2,
    PID.3...), its jobs trained afresh. Later segments
    are submitted by `hetsched replan`. A pool-mode plan becomes ONE hetjob
    holding the pool's GPUs, one `hetsched exec` per GPU (--dry-run also
    prints each GPU's task sequence).

    Jobs go in the plan's order: one that takes GPUs another frees waits for
    it (--dependency=afterany). Each job gets a time limit and SIGUSR1 before
    it (checkpoint and requeue), at most the partition's MaxTime. Sbatch options: a job's own `slurm:` keys,
    then the jobs file's `slurm:`, then these options, then the config
    (`hetsched config show`). An SBATCH_* variable for an option the script
    sets is not passed to sbatch (a warning names it), nor are the SLURM_*
    variables of a job this command runs in.
    SIGINT/SIGTERM/SIGHUP cancel what it submitted (exit 130/143/129; nohup: a hangup
    is ignored). It waits for a replan, submit or cancel acting on the batch (up to 5 min).

    Exit codes: 0 ok, 2 bad input, 3 sbatch/scancel failed (nothing left
    queued), 4 Slurm did not answer, 6-10 state file unusable (`hetsched --help`),
    11 a file another user could write, 75 another command held the batch 5 minutes,
    130, 143, 129 interrupted by SIGINT, SIGTERM, SIGHUP (nothing left queued).
    """
    from hetsched.app.plan import parse_params, plan_settings
    from hetsched.app.submit import base_sbatch, submit

    sbatch = base_sbatch(_cli_sbatch(time=time_, account=account, qos=qos, mem=mem,
                                     cpus_per_gpu=cpus_per_gpu, constraint=constraint,
                                     extra=list(extra) or None))
    settings = plan_settings(mode=mode, policy=policy, params=parse_params(params),
                             static=static, restart_cost_s=restart_cost,
                             task_iterations=task_iterations)
    plan = load_plan_input(plan_file, settings, throughputs=throughputs,
                           cluster_file=cluster_file, partition=partition,
                           skip_unplaceable=skip_unplaceable)
    part = _partition(partition)
    if dry_run:
        from hetsched.state.store import default_path

        state = Path(state_path) if state_path else default_path()
        res = submit(plan, None, None, dry_run=True, partition=part, pin_nodes=pin_nodes,
                     source=plan_file, sbatch=sbatch,
                     files_base=Path(str(state) + ".files"))  # the real paths, not stand-ins
        for name in getattr(res, "order", None) or list(res.scripts):
            script = res.scripts[name]
            after = getattr(res, "after", {}).get(name)
            click.echo(f"# ---- {name} ({len(script.components)} components"
                       + (f"; after {', '.join(after)}" if after else "") + ") ----")
            click.echo(script.text, nl=False)
        for line in getattr(res, "sequences", []):  # a pool plan: each GPU's tasks
            click.echo(f"# {line}")
        for name, why in getattr(res, "unrunnable", []):
            click.echo(f"warning: {name} would fail where it runs: {why}", err=True)
        click.echo(f"# dry run: {len(res.scripts)} hetjobs for plan {res.plan_id}; "
                   "nothing submitted", err=True)
        return
    with _store(state_path) as st:
        res = submit(plan, st, _client(), partition=part, pin_nodes=pin_nodes,
                     source=plan_file, progress=logs.say,
                     sbatch=sbatch, skip_unrunnable=skip_unplaceable)
    for name, why in res.unrunnable:
        click.echo(f"skipped {name}: would fail where it runs: {why}", err=True)
    for name, jid in res.skipped:
        click.echo(f"{name}: already submitted as Slurm job {jid}", err=True)
    if parsable:
        for jid in dict.fromkeys(j for _, j in res.submitted):  # a pool plan: one id
            click.echo(jid)
        return
    click.echo(f"plan {res.plan_id}: {len(res.submitted)} submitted, {len(res.skipped)} "
               "already there")


# ---------------------------------------------------------------------------
# status / watch


def _spool(spool: str | None) -> str | None:
    return spool or config.get("spool") or None


def _print_status_table(jobs: list[JobStatus]) -> None:
    from hetsched.cli.tables import print_table, status_notes, status_table, stdout_console

    con = stdout_console()
    print_table(con, status_table(jobs, con.width))
    for line in status_notes(jobs):
        click.echo(line)


@click.command("status")
@state_option
@format_option("table", "json")
@click.option("--png", "png_out", type=click.Path(dir_okay=False), default=None,
              callback=needs_extra("matplotlib"),
              help="Also draw measured vs predicted iteration time per job (job reports) here.")
@click.option("--all", "all_batches", is_flag=True,
              help="Every job the state file knows, not only the current batch.")
def status_cmd(state_path: str | None, fmt: str, png_out: str | None,
               all_batches: bool = False) -> None:
    """Show every job of the batch as Slurm sees it now (one squeue call); read-only.

    The batch is the last plan submitted (with the plans a replan made of it);
    jobs of earlier batches still queued or running are listed too.

    Per job: full name, Slurm id, state, Slurm's reason (or hetsched's: why a
    job waits, was given up or cancelled), elapsed time, the plan's predicted
    start and end, and the measured vs predicted iteration time from the job
    reports. Records nothing and creates no file (`watch` and `replan` do).
    """
    from hetsched.app.status import (
        batch_status,
        replan_has_work,
        state_path_missing,
        status_json,
    )
    from hetsched.state.store import open_store_readonly

    path = Path(state_path) if state_path else config.state_path()
    st = open_store_readonly(path)
    if st is None:
        if fmt == "json":
            click.echo(status_json([], 0))
        else:
            click.echo(state_path_missing(path))
        return
    with st:
        client = _client()
        c0 = client.runner.total()
        from hetsched.app.modes import active_mode
        from hetsched.slurm.runner import SlurmUnavailable

        pool = active_mode(st).progress(st)  # a pool plan: per job rounds, tasks, JCTs
        try:
            jobs = batch_status(st, client, all_batches=all_batches)
        except SlurmUnavailable:
            # a pool's progress is in its executors' report files: say it, then the error
            for line in pool.lines() if pool and fmt != "json" else []:
                click.echo(line)
            raise
        if png_out:
            from dataclasses import asdict

            from hetsched.cli.pictures import png_predicted_vs_measured

            drawn = png_predicted_vs_measured([asdict(j) for j in jobs], png_out)
            click.echo(f"{png_out}: {drawn['points']} jobs measured", err=True)
        if fmt == "json":
            click.echo(status_json(jobs, client.runner.total() - c0,
                                   pool.to_dict() if pool else None))
            return
        _print_status_table(jobs)
        for line in pool.lines() if pool else []:
            click.echo(line)
        pending = st.events(unhandled_only=True)
        if pending and replan_has_work(jobs):  # not after the last job ended or was cancelled
            n = len(pending)
            click.echo(f"{n} reset event{'s wait' if n != 1 else ' waits'} for "
                       "`hetsched replan`")


@click.command("watch")
@state_option
@partition_option("Partition to watch for node events.")
@click.option("--spool", type=click.Path(file_okay=False), default=None, envvar="HETSCHED_SPOOL",
              show_envvar=True, help="Spool directory (default: $HETSCHED_SPOOL).")
@click.option("--interval", type=click.FloatRange(0.1), default=5.0, show_default=True,
              help="Seconds between polls while things change.")
@click.option("--max-interval", type=click.FloatRange(0.1), default=60.0, show_default=True,
              help="Upper bound of the growing interval when nothing changes.")
@click.option("--cycles", type=click.IntRange(1), default=None,
              help="Stop after this many successful polls.")
@click.option("--until-done", is_flag=True, help="Stop when no hetsched job is queued.")
def watch_cmd(state_path: str | None, partition: str | None, spool: str | None,
              interval: float, max_interval: float, cycles: int | None,
              until_done: bool) -> None:
    """Poll Slurm (one squeue per cycle, with backoff); print events and job counts.

    When slurmctld stops answering (restart, outage), watch waits with
    exponential backoff and resumes; it does not exit. Events are recorded for
    `hetsched replan`.
    """
    from hetsched.app.monitor import Cycle, Monitor, watch
    from hetsched.app.status import batch_counts
    from hetsched.slurm.client import CliSlurmClient
    from hetsched.slurm.runner import Runner

    with _store(state_path) as st:
        # no retries inside a cycle: watch's own backoff handles outages
        client = CliSlurmClient(Runner(retries=0, timeout_s=30))
        mon = Monitor(st, client, partition=_partition(partition), spool=_spool(spool))

        last: list[str] = []

        def show(cycle: Cycle) -> None:
            for ev in cycle.events:
                click.echo(f"{time.strftime('%H:%M:%S')} {ev}")
            c = batch_counts(st)
            line = ", ".join(f"{k} {v}" for k, v in c.items() if v or k != "cancelled")
            if [line] != last:  # print the counts when they change
                click.echo(f"{time.strftime('%H:%M:%S')} {line}")
                last[:] = [line]

        def done(cycle: Cycle) -> bool:
            return until_done and not mon.live()

        watch(mon, interval_s=interval, max_interval_s=max_interval, cycles=cycles,
              until=done, on_cycle=show, on_wait=lambda m: click.echo(m, err=True))


# ---------------------------------------------------------------------------
# cancel


@click.command("cancel")
@click.argument("jobs", nargs=-1)
@click.option("--all", "all_jobs", is_flag=True, help="Cancel every queued or running job "
              "of the batch.")
@click.option("--reason", default="", help="Why (recorded in the state file's events).")
@state_option
def cancel_cmd(jobs: tuple[str, ...], all_jobs: bool, reason: str,
               state_path: str | None) -> None:
    """Cancel JOBs (hetsched job names) or --all, for good, and record why.

    A cancelled job is never resubmitted by `hetsched replan`; neither is one
    cancelled with `scancel` (Slurm's CANCELLED state tells it from a failure).
    The freed GPUs go to the rest at the next replan. A replan or submit acting
    on the batch is let finish first (said; at most 5 minutes). Exit codes: 0
    ok, 2 bad input (unknown job), 3 scancel failed, 4 Slurm did not answer
    (nothing changed), 6-10 state file unusable, 75 the batch stayed busy
    (nothing cancelled; `hetsched --help` lists every code).
    """
    from hetsched.app.modes import active_mode

    if bool(jobs) == all_jobs:
        raise InputError("hetsched cancel", "give job names or --all (not both)", "JOB")
    with _store(state_path) as st:
        res = active_mode(st).cancel(st, _client(), None if all_jobs else list(jobs),
                                     reason=reason, say=logs.say)
    for name, state in res.not_active:
        click.echo(f"{name}: not queued or running ({state}); left as is", err=True)
    for name, jid in res.cancelled:
        click.echo(f"cancelled {name} (Slurm job {jid})")
    for name, jid in res.dropped:
        click.echo(f"dropped {name} from pool job {jid}; the next `hetsched replan` "
                   "restarts the pool from its checkpoints without it")
    if not res.cancelled and not res.dropped:
        click.echo("nothing to cancel")
