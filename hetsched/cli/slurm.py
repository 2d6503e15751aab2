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
from hetsched.app.monitor import Cycle, Monitor, watch
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
from hetsched.app.submit import submit
from hetsched.core.plan import Plan
from hetsched.errors import HetschedError, InputError
from hetsched.io.plan_json import load_plan
from hetsched.slurm.client import CliSlurmClient, make_client
from hetsched.slurm.inventory import load_cluster_from_slurm, load_inventory
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import DEFAULT_NODES, open_testbed
from hetsched.state.store import Store, open_store

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
                    partition: str | None, backend: str = "cli") -> Plan:
    """A typed plan from plan.json, or from jobs.yaml by planning first."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        from hetsched.io.profiles import load_throughputs
        from hetsched.io.specs import load_cluster, load_jobs
        from hetsched.planning.planner import make_plan

        if not throughputs:
            raise InputError("--throughputs", f"{path} is a jobs file: planning it needs "
                             "--throughputs CSV (profiles)")
        jobs = load_jobs(p)
        table = load_throughputs(throughputs)
        cl = load_cluster(cluster_file) if cluster_file else load_cluster_from_slurm(
            _client(backend), _partition(partition))
        return make_plan(jobs, cl, table, policy=policy, jobs_source=str(p))
    return load_plan(p)


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
def submit_cmd(plan_file: str, dry_run: bool, state_path: str | None, partition: str | None,
               pin_nodes: bool, throughputs: str | None, policy: str,
               cluster_file: str | None) -> None:
    """Submit PLAN_FILE (plan.json, or jobs.yaml planned first) to Slurm as hetjobs.

    Each job's first segment becomes one heterogeneous job: one component per
    (GPU type, node) group with --gres=gpu:TYPE:N and one srun step across
    them. All or nothing: if an sbatch fails, what this run submitted is
    cancelled. Re-running after a crash does not submit twice. Later segments
    are submitted by `hetsched replan`.

    Exit codes: 0 ok, 2 bad input, 3 sbatch/scancel failed (nothing left
    queued), 4 Slurm unreachable, 6 state file unusable.
    """
    plan = load_plan_input(plan_file, throughputs, policy, cluster_file, partition)
    part = _partition(partition)
    if dry_run:
        res = submit(plan, None, None, dry_run=True, partition=part, pin_nodes=pin_nodes,
                     source=plan_file)
        for name, script in res.scripts.items():
            click.echo(f"# ---- {name} ({len(script.components)} components) ----")
            click.echo(script.text, nl=False)
        for line in getattr(res, "sequences", []):  # a pool plan: each GPU's tasks
            click.echo(f"# {line}")
        click.echo(f"# dry run: {len(res.scripts)} hetjobs for plan {res.plan_id}; "
                   "nothing submitted", err=True)
        return
    with _store(state_path) as st:
        res = submit(plan, st, _client(), partition=part, pin_nodes=pin_nodes,
                     source=plan_file, progress=lambda m: click.echo(m, err=True))
    for name, jid in res.skipped:
        click.echo(f"{name}: already submitted as Slurm job {jid}", err=True)
    click.echo(f"plan {res.plan_id}: {len(res.submitted)} submitted, {len(res.skipped)} "
               "already there")


# ---------------------------------------------------------------------------
# status / watch


def _spool(spool: str | None) -> str | None:
    return spool or config.get("spool") or None


def _print_cycle_table(st: Store, cycle: Cycle) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="hetsched jobs")
    for col in ("job", "plan", "Slurm id", "state", "GPUs"):
        t.add_column(col)
    for name, row in sorted(latest_rows(st).items()):
        types: dict[str, int] = {}
        for w in row.workers:
            types[str(w["gpu_type"])] = types.get(str(w["gpu_type"]), 0) + 1
        t.add_row(name, row.plan_id, row.slurm_id or "-", cycle.jobs.get(name, row.state),
                  " ".join(f"{k}x{v}" for k, v in sorted(types.items())))
    Console().print(t)


@click.command("status")
@click.option("--state", "state_path", default=None, help=STATE_HELP)
@click.option("--partition", "-p", default=None, help="Partition to watch for node events.")
@click.option("--spool", default=None, help="Spool directory for new jobs files "
              "(default: $HETSCHED_SPOOL).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_cmd(state_path: str | None, partition: str | None, spool: str | None,
               as_json: bool) -> None:
    """Show hetsched's jobs as Slurm sees them now (one squeue call) and new events."""
    with _store(state_path) as st:
        mon = Monitor(st, _client(), partition=_partition(partition), spool=_spool(spool))
        cycle = mon.poll()
        from hetsched.app.pool_status import active_pool_progress

        pool = active_pool_progress(st)  # a pool plan: per job rounds, tasks, JCTs
        if as_json:
            click.echo(json.dumps({"jobs": cycle.jobs, "commands": cycle.commands,
                                   "events": [vars(e) for e in cycle.events],
                                   **({"pool": pool.to_dict()} if pool else {})}, indent=2))
            return
        _print_cycle_table(st, cycle)
        for line in pool.lines() if pool else []:
            click.echo(line)
        for ev in cycle.events:
            click.echo(f"event {ev}")
        pending = [e for e in st.events(unhandled_only=True)]
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
    """Poll Slurm (one squeue per cycle, with backoff) and print reset events.

    When slurmctld stops answering (restart, outage), watch waits with
    exponential backoff and resumes; it does not exit. Events are recorded for
    `hetsched replan`.
    """
    with _store(state_path) as st:
        # no retries inside a cycle: watch's own backoff handles outages
        client = CliSlurmClient(Runner(retries=0, timeout_s=30))
        mon = Monitor(st, client, partition=_partition(partition), spool=_spool(spool))

        def show(cycle: Cycle) -> None:
            for ev in cycle.events:
                click.echo(f"{time.strftime('%H:%M:%S')} {ev}")

        def done(cycle: Cycle) -> bool:
            return until_done and not mon.live()

        watch(mon, interval_s=interval, max_interval_s=max_interval, cycles=cycles,
              until=done, on_cycle=show, on_wait=lambda m: click.echo(m, err=True))


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
    2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6 state file
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
    if as_json:
        click.echo(result_json(res))
    elif res.changed or res.status == "dry-run" or verbose:
        click.echo(res.summary())
