"""Click commands for the Slurm side of hetsched.

Standalone click objects, registered by ``hetsched/cli.py`` with
``main.add_command(...)``: ``testbed`` (group), ``cluster``, ``submit``,
``status``, ``watch``, ``replan``. They parse options, call the library and
render; errors are HetschedError subclasses that the main entry point prints
as one line with their exit code.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from hetsched import config
from hetsched.app.monitor import Cycle, Monitor, state_counts, watch
from hetsched.app.replan import (
    ReplanLocked,
    default_lock,
    default_log,
    file_logger,
    latest_rows,
    replan,
    replan_lock,
    result_json,
)
from hetsched.app.replan_changes import changes_table
from hetsched.app.status import JobStatus, when
from hetsched.app.submit import base_sbatch, submit
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptionError, SbatchOptions
from hetsched.errors import HetschedError, InputError
from hetsched.io.plan_json import load_plan
from hetsched.slurm.client import CliSlurmClient, make_client
from hetsched.slurm.inventory import load_cluster_from_slurm, load_inventory
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import DEFAULT_NODES, open_testbed
from hetsched.state.store import Store, open_store, open_store_readonly

DIR_HELP = "Testbed directory (configs, logs, state). Default: $HETSCHED_TESTBED or ./.testbed"


def _default_dir() -> str:
    return config.get("testbed") or ".testbed"


# ---------------------------------------------------------------------------
# testbed


@click.group("testbed")
def testbed() -> None:
    """Start and stop a real, loopback-only Slurm test cluster.

    It runs munged, slurmctld and one slurmd per node on 127.0.0.1, on ports
    derived from DIR, with typed fake GPUs. Point Slurm's commands and
    hetsched at it with:

    \b
        eval "$(hetsched testbed env --dir DIR)"
    """


@testbed.command("up")
@click.option("--dir", "directory", default=_default_dir, show_default="$HETSCHED_TESTBED or "
              "./.testbed", help=DIR_HELP)
@click.option("--nodes", default=None, metavar="TYPE:NxG,...",
              help=f"GPU type : nodes x GPUs per node [default: {DEFAULT_NODES}, or what DIR "
              "last ran with].")
@click.option("--port-base", type=click.IntRange(1024, 65000), default=None,
              help="First of the ports used (slurmctld; slurmd take the next ones). "
              "Default: derived from DIR.")
@click.option("--lua/--no-lua", default=None,
              help="Enable JobSubmitPlugins=lua with slurm_plugins/job_submit.lua.")
@click.option("--spank", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Load this SPANK plugin (e.g. a built slurm_plugins/spank_hetsched.c).")
@click.option("--timeout", type=float, default=60.0, show_default=True,
              help="Seconds to wait for every node to become idle.")
def testbed_up(directory: str, nodes: str | None, port_base: int | None, lua: bool | None,
               spank: str | None, timeout: float) -> None:
    """Start the testbed (idempotent) and wait until all nodes are idle."""
    tb = open_testbed(directory, nodes=nodes, port_base=port_base, lua=lua, spank=spank)
    tb.up(timeout_s=timeout)
    n = len(tb.node_confs)
    click.echo(f"testbed up in {tb.dir}: {n} nodes ({tb.nodes_spec}), slurmctld port "
               f"{tb.port_base}{', job_submit/lua' if tb.lua else ''}", err=True)
    click.echo(f'use it with: eval "$(hetsched testbed env --dir {tb.dir})"', err=True)


@testbed.command("down")
@click.option("--dir", "directory", default=_default_dir, help=DIR_HELP)
def testbed_down(directory: str) -> None:
    """Cancel the testbed's jobs and stop every daemon it started."""
    tb = open_testbed(directory)
    stopped = tb.down()
    click.echo(f"stopped {len(stopped)} daemons in {tb.dir}" if stopped
               else f"nothing running in {tb.dir}", err=True)


@testbed.command("status")
@click.option("--dir", "directory", default=_default_dir, help=DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def testbed_status(directory: str, as_json: bool) -> None:
    """Show the testbed's daemons and node states. Exit 1 when not (fully) up."""
    tb = open_testbed(directory)
    info = tb.status()
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        click.echo(f"testbed {info['dir']} ({info['nodes']}, port {info['port_base']}): "
                   f"{'up' if info['up'] else 'not up'}")
        procs = info["processes"]
        assert isinstance(procs, dict)
        for name, pid in procs.items():
            click.echo(f"  {name:<16} {'pid ' + str(pid) if pid else 'stopped'}")
        states = info.get("node_states")
        if isinstance(states, dict):
            for node, state in sorted(states.items()):
                click.echo(f"  node {node:<11} {state}")
        elif states:
            click.echo(f"  nodes: {states}")
    sys.exit(0 if info["up"] else 1)


@testbed.command("env")
@click.option("--dir", "directory", default=_default_dir, help=DIR_HELP)
def testbed_env(directory: str) -> None:
    """Print `export` lines (SLURM_CONF, HETSCHED_STATE, ...) for `eval`."""
    tb = open_testbed(directory)
    if not Path(tb.conf).exists():
        click.echo(f"# no testbed in {tb.dir}; run `hetsched testbed up --dir {tb.dir}`",
                   err=True)
    click.echo(tb.env_lines(), nl=False)


# ---------------------------------------------------------------------------
# cluster


def _client(backend: str = "cli") -> CliSlurmClient:
    """The Slurm client for CLI commands (reads SLURM_CONF from the environment)."""
    client, note = make_client(Runner(), backend)
    if backend != "cli":
        click.echo(note, err=True)
    return client


def _partition(partition: str | None) -> str | None:
    return partition or config.get("partition") or None


@click.command("cluster")
@click.option("--partition", "-p", default=None,
              help="Slurm partition. Default: $HETSCHED_PARTITION, else all nodes.")
@click.option("--json", "as_json", is_flag=True, help="Print the cluster as JSON.")
@click.option("--nodes/--no-nodes", "show_nodes", default=True, show_default=True,
              help="Also list each node.")
@click.option("--backend", type=click.Choice(["cli", "pyslurm"]), default="cli",
              show_default=True, help="pyslurm is used for reads only if it matches Slurm.")
def cluster(partition: str | None, as_json: bool, show_nodes: bool, backend: str) -> None:
    """Show a partition's GPU mix by type, node states and free GPUs (from sinfo)."""
    from rich.console import Console
    from rich.table import Table

    inv = load_inventory(_client(backend), _partition(partition))
    if as_json:
        click.echo(json.dumps(inv.to_dict(), indent=2))
        return
    console = Console()
    t = Table(title=f"partition {inv.cluster.partition or '(all)'}")
    for col in ("GPU type", "nodes", "GPUs", "usable", "free", "node states"):
        t.add_column(col, justify="left" if col in ("GPU type", "node states") else "right")
    for r in inv.by_type():
        t.add_row(r.gpu_type, str(r.nodes), str(r.gpus), str(r.usable), str(r.free),
                  ", ".join(f"{k}:{v}" for k, v in sorted(r.states.items())))
    console.print(t)
    if show_nodes:
        nt = Table(title="nodes")
        for col in ("node", "GPU type", "GPUs", "free", "state"):
            nt.add_column(col)
        for n in inv.cluster.nodes:
            nt.add_row(n.name, n.gpu_type, str(n.gpus), str(inv.free.get(n.name, 0)), n.state)
        console.print(nt)
    for s in inv.skipped:
        click.echo(f"note: {s}", err=True)


# ---------------------------------------------------------------------------
# submit


def _store(path: str | None) -> Store:
    return open_store(path)


STATE_HELP = "State file (SQLite). Default: $HETSCHED_STATE, else ~/.local/state/hetsched/state.db"


def load_plan_input(path: str, throughputs: str | None, policy: str, cluster_file: str | None,
                    partition: str | None, backend: str = "cli",
                    skip_unplaceable: bool = False) -> Plan:
    """A typed plan from plan.json, or from jobs.yaml by planning first."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        from hetsched.app.runnable import plan_placeable
        from hetsched.io.profiles import load_throughputs
        from hetsched.io.specs import load_cluster, load_jobs

        if not throughputs:
            raise InputError("--throughputs", f"{path} is a jobs file: planning it needs "
                             "--throughputs CSV (profiles)")
        jobs = load_jobs(p)
        table = load_throughputs(throughputs)
        cl = load_cluster(cluster_file) if cluster_file else load_cluster_from_slurm(
            _client(backend), _partition(partition))
        return plan_placeable(jobs, cl, table, skip_unplaceable=skip_unplaceable,
                              policy=policy, jobs_source=str(p),
                              warn=lambda m: click.echo(m, err=True))
    return load_plan(p)


def _cli_sbatch(**opts: object) -> SbatchOptions:
    """``hetsched submit``'s sbatch options, validated (the error names the option)."""
    try:
        return SbatchOptions.parse({k: v for k, v in opts.items() if v is not None})
    except SbatchOptionError as e:
        raise InputError(f"--{'sbatch-option' if e.key == 'extra' else e.key}", str(e)) from None


@click.command("submit")
@click.argument("plan_file", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print the sbatch scripts; touch neither Slurm "
              "nor the state file.")
@click.option("--state", "state_path", default=None, help=STATE_HELP)
@click.option("--partition", "-p", default=None,
              help="Partition for the jobs. Default: $HETSCHED_PARTITION, else Slurm's default.")
@click.option("--pin-nodes/--any-node", default=True, show_default=True,
              help="Pin each component to the plan's node (--nodelist), or let Slurm pick "
              "any node with that GPU type.")
@click.option("--throughputs", "-t", default=None, type=click.Path(dir_okay=False),
              help="Profiles CSV; needed when PLAN_FILE is a jobs.yaml.")
@click.option("--policy", default="auto", show_default=True,
              help="Policy for planning a jobs.yaml.")
@click.option("--cluster", "cluster_file", default=None, type=click.Path(dir_okay=False),
              help="Cluster YAML for planning a jobs.yaml (default: the Slurm partition).")
@click.option("--time", "time_", default=None, help="Time limit for every job (Slurm format); "
              "default: predicted duration x time_margin + time_pad_s.")
@click.option("--account", default=None, help="Slurm account (--account).")
@click.option("--qos", default=None, help="Slurm QoS (--qos).")
@click.option("--mem", default=None, help="Memory per node (--mem), e.g. 64G.")
@click.option("--constraint", default=None, help="Node features (--constraint).")
@click.option("--skip-unplaceable", is_flag=True,
              help="Leave out the jobs that cannot be placed (planning a jobs.yaml) or would "
              "fail where they run (no command/entrypoint/built-in); list them on stderr.")
@click.option("--sbatch-option", "extra", multiple=True,
              help="Extra sbatch option for every job, e.g. --sbatch-option=--exclusive "
              "(repeatable).")
def submit_cmd(plan_file: str, dry_run: bool, state_path: str | None, partition: str | None,
               pin_nodes: bool, throughputs: str | None, policy: str,
               cluster_file: str | None, time_: str | None, account: str | None,
               qos: str | None, mem: str | None, constraint: str | None,
               skip_unplaceable: bool, extra: tuple[str, ...]) -> None:
    """Submit PLAN_FILE (plan.json, or jobs.yaml planned first) to Slurm as hetjobs.

    Each job's first segment becomes one heterogeneous job: one component per
    (GPU type, node) group with --gres=gpu:TYPE:N and one srun step across
    them. All or nothing: if an sbatch fails, what this run submitted is
    cancelled. Re-running after a crash does not submit twice. Later segments
    are submitted by `hetsched replan`. A pool-mode plan becomes ONE hetjob
    holding the pool's GPUs, one `hetsched exec` per GPU (--dry-run also
    prints each GPU's task sequence).

    Jobs go in the plan's order: one that takes GPUs another frees waits for
    it (--dependency=afterany). Each job gets a time limit and SIGUSR1 before
    it (checkpoint and requeue). Sbatch options: a job's own `slurm:` keys,
    then the jobs file's `slurm:`, then these options, then the config
    (`hetsched config show`); Slurm's SBATCH_* variables override them all.
    SIGINT/SIGTERM during submit cancel what it submitted (exit 130).

    Exit codes: 0 ok, 2 bad input, 3 sbatch/scancel failed (nothing left
    queued), 4 Slurm unreachable, 6-10 state file unusable (docs/reliability.md),
    130 interrupted (nothing left queued).
    """
    sbatch = base_sbatch(_cli_sbatch(time=time_, account=account, qos=qos, mem=mem,
                                     constraint=constraint, extra=list(extra) or None))
    plan = load_plan_input(plan_file, throughputs, policy, cluster_file, partition,
                           skip_unplaceable=skip_unplaceable)
    part = _partition(partition)
    if dry_run:
        res = submit(plan, None, None, dry_run=True, partition=part, pin_nodes=pin_nodes,
                     source=plan_file, sbatch=sbatch)
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
                     source=plan_file, progress=lambda m: click.echo(m, err=True),
                     sbatch=sbatch, skip_unrunnable=skip_unplaceable)
    for name, why in res.unrunnable:
        click.echo(f"skipped {name}: would fail where it runs: {why}", err=True)
    for name, jid in res.skipped:
        click.echo(f"{name}: already submitted as Slurm job {jid}", err=True)
    click.echo(f"plan {res.plan_id}: {len(res.submitted)} submitted, {len(res.skipped)} "
               "already there")


# ---------------------------------------------------------------------------
# status / watch


def _spool(spool: str | None) -> str | None:
    return spool or config.get("spool") or None


def _print_status_table(jobs: list[JobStatus]) -> None:
    from rich.console import Console
    from rich.table import Table

    now = time.time()
    t = Table(title="hetsched jobs")
    width = max((len(j.job) for j in jobs), default=3)
    t.add_column("job", no_wrap=True, min_width=width)  # full names, never cut
    for col in ("Slurm id", "state", "reason", "elapsed", "pred. start", "pred. end",
                "iter s (meas/pred)", "GPUs"):
        t.add_column(col, overflow="fold")
    for j in jobs:
        it = (f"{j.measured_iter_s:.3g}" if j.measured_iter_s is not None else "-") + " / " \
            + (f"{j.predicted_iter_s:.3g}" if j.predicted_iter_s is not None else "-")
        el = f"{j.elapsed_s:.0f}s" if j.elapsed_s is not None else "-"
        t.add_row(j.job, j.slurm_id, j.state, j.reason or "-", el,
                  when(j.predicted_start, now), when(j.predicted_end, now), it, j.gpus or "-")
    Console(width=max(120, width + 110)).print(t)


@click.command("status")
@click.option("--state", "state_path", default=None, help=STATE_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="json carries every field of the table.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
def status_cmd(state_path: str | None, fmt: str, as_json: bool) -> None:
    """Show every job of the batch as Slurm sees it now (one squeue call); read-only.

    Per job: full name, Slurm id, state, Slurm's reason (or hetsched's: why a
    job waits, was given up or cancelled), elapsed time, the plan's predicted
    start and end, and the measured vs predicted iteration time from the job
    reports. Records nothing and creates no file (`watch` and `replan` do).
    """
    from hetsched.app.status import batch_status, state_path_missing, status_json

    path = Path(state_path) if state_path else config.state_path()
    st = open_store_readonly(path)
    if st is None:
        if as_json or fmt == "json":
            click.echo(status_json([], 0))
        else:
            click.echo(state_path_missing(path))
        return
    with st:
        client = _client()
        c0 = client.runner.total()
        jobs = batch_status(st, client)
        from hetsched.app.pool_status import active_pool_progress

        pool = active_pool_progress(st)  # a pool plan: per job rounds, tasks, JCTs
        if as_json or fmt == "json":
            click.echo(status_json(jobs, client.runner.total() - c0,
                                   pool.to_dict() if pool else None))
            return
        _print_status_table(jobs)
        for line in pool.lines() if pool else []:
            click.echo(line)
        pending = st.events(unhandled_only=True)
        if pending:
            click.echo(f"{len(pending)} reset events wait for `hetsched replan`")


@click.command("watch")
@click.option("--state", "state_path", default=None, help=STATE_HELP)
@click.option("--partition", "-p", default=None, help="Partition to watch for node events.")
@click.option("--spool", default=None, help="Spool directory (default: $HETSCHED_SPOOL).")
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
    with _store(state_path) as st:
        # no retries inside a cycle: watch's own backoff handles outages
        client = CliSlurmClient(Runner(retries=0, timeout_s=30))
        mon = Monitor(st, client, partition=_partition(partition), spool=_spool(spool))

        last: list[str] = []

        def show(cycle: Cycle) -> None:
            for ev in cycle.events:
                click.echo(f"{time.strftime('%H:%M:%S')} {ev}")
            c = state_counts(r.state for r in latest_rows(st).values())
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
@click.option("--state", "state_path", default=None, help=STATE_HELP)
def cancel_cmd(jobs: tuple[str, ...], all_jobs: bool, reason: str,
               state_path: str | None) -> None:
    """Cancel JOBs (hetsched job names) or --all, for good, and record why.

    A cancelled job is never resubmitted by `hetsched replan`; neither is one
    cancelled with `scancel` (Slurm's CANCELLED state tells it from a failure).
    The freed GPUs go to the rest at the next replan. Exit codes: 0 ok, 2 bad
    input (unknown job), 3 scancel failed, 6-10 state file unusable (docs/reliability.md).
    """
    from hetsched.app.cancel import cancel_jobs

    if bool(jobs) == all_jobs:
        raise InputError("hetsched cancel", "give job names or --all (not both)", "JOB")
    with _store(state_path) as st:
        res = cancel_jobs(st, _client(), None if all_jobs else list(jobs), reason=reason)
    for name, state in res.not_active:
        click.echo(f"{name}: not queued or running ({state}); left as is", err=True)
    for name, jid in res.cancelled:
        click.echo(f"cancelled {name} (Slurm job {jid})")
    if not res.cancelled:
        click.echo("nothing to cancel")


# ---------------------------------------------------------------------------
# replan


def _table(throughputs: str | None, st: Store) -> object:
    from hetsched.io.profiles import load_throughputs

    if throughputs:
        return load_throughputs(throughputs)
    # the profile history, without the pairs whose probes failed
    from hetsched.state.history import table_from_store

    return table_from_store(st)


@click.command("replan")
@click.option("--state", "state_path", default=None, help=STATE_HELP)
@click.option("--throughputs", "-t", default=None, type=click.Path(dir_okay=False),
              help="Profiles CSV (default: the state file's profiles table).")
@click.option("--policy", default=None, help="Policy (default: the active plan's).")
@click.option("--partition", "-p", default=None, help="Partition (default: $HETSCHED_PARTITION).")
@click.option("--spool", default=None, help="Directory of new jobs files "
              "(default: $HETSCHED_SPOOL); processed files move to SPOOL/done/.")
@click.option("--force", is_flag=True, help="Replan even without reset events.")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--wait", "wait_s", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds to wait for another replan's lock before giving up (exit 75).")
@click.option("--max-failures", type=click.IntRange(0), default=2, show_default=True,
              help="Resubmit a failed job at most this many times.")
@click.option("--log", "log_path", default=None,
              help="Log file (default: STATE.files/replan.log).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Print even when nothing changed.")
def replan_cmd(state_path: str | None, throughputs: str | None, policy: str | None,
               partition: str | None, spool: str | None, force: bool, dry_run: bool,
               wait_s: float, max_failures: int, log_path: str | None, as_json: bool,
               verbose: bool) -> None:
    """Replan after reset events and bring Slurm in line (cron-safe).

    Quiet unless something changed. Exit codes: 0 ok, 1 unexpected error,
    2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6-10 state file
    unusable, 75 another replan holds the lock (skipped). Example crontab:

    \b
        * * * * * eval "$(hetsched testbed env --dir D)"; hetsched replan -t p.csv
    """
    with _store(state_path) as st:
        log = file_logger(log_path or default_log(st))
        try:
            with replan_lock(default_lock(st), wait_s=wait_s):
                table = _table(throughputs, st)
                res = replan(st, _client(), table, policy=policy,
                             partition=_partition(partition), spool=_spool(spool),
                             force=force, dry_run=dry_run, max_failures=max_failures, log=log)
        except ReplanLocked as e:
            log(str(e))
            if verbose:
                click.echo(str(e), err=True)
            sys.exit(e.exit_code)
        except HetschedError as e:
            log(f"error (exit {e.exit_code}): {e}")
            raise
        log(res.summary())
        table = changes_table(res.changes)
        if table:
            log("changes:\n" + table)
    if as_json:
        click.echo(result_json(res))
    elif res.changed or res.status == "dry-run" or verbose or res.gave_up_now:
        click.echo(res.summary())
        if table:
            click.echo(table)
