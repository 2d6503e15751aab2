"""Click commands that look at or stand up a Slurm: ``testbed`` (group) and ``cluster``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hetsched import config
from hetsched.cli.options import format_option, partition_option
from hetsched.cli.slurm import _client, _partition
from hetsched.slurm.inventory import load_inventory
from hetsched.slurm.testbed import DEFAULT_NODES, open_testbed

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
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=_default_dir,
              show_default="$HETSCHED_TESTBED or "
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
    """Start the testbed (idempotent; as root: its daemons run as root) and wait until all
    nodes are idle. DIR must be a path slurm.conf can hold (no blank, #, %, quote)."""
    tb = open_testbed(directory, nodes=nodes, port_base=port_base, lua=lua, spank=spank)
    tb.up(timeout_s=timeout)
    n = len(tb.node_confs)
    click.echo(f"testbed up in {tb.dir}: {n} nodes ({tb.nodes_spec}), slurmctld port "
               f"{tb.port_base}{', job_submit/lua' if tb.lua else ''}", err=True)
    click.echo(f'use it with: eval "$(hetsched testbed env --dir {tb.dir})"', err=True)


@testbed.command("down")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=_default_dir,
              help=DIR_HELP)
def testbed_down(directory: str) -> None:
    """Cancel the testbed's jobs and stop every daemon it started."""
    tb = open_testbed(directory)
    stopped = tb.down()
    click.echo(f"stopped {len(stopped)} daemons in {tb.dir}" if stopped
               else f"nothing running in {tb.dir}", err=True)


@testbed.command("status")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=_default_dir,
              help=DIR_HELP)
@format_option("table", "json")
def testbed_status(directory: str, fmt: str) -> None:
    """Show the testbed's daemons and node states. Exit 1 when not (fully) up."""
    tb = open_testbed(directory)
    info = tb.status()
    if fmt == "json":
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
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=_default_dir,
              help=DIR_HELP)
def testbed_env(directory: str) -> None:
    """Print `export` lines (SLURM_CONF, HETSCHED_STATE, ...) for `eval`."""
    tb = open_testbed(directory)
    if not Path(tb.conf).exists():
        click.echo(f"# no testbed in {tb.dir}; run `hetsched testbed up --dir {tb.dir}`",
                   err=True)
    click.echo(tb.env_lines(), nl=False)


# ---------------------------------------------------------------------------
# cluster


@click.command("cluster")
@partition_option("Slurm partition. Default: the `partition` setting, else all nodes.")
@format_option("table", "json")
@click.option("--nodes/--no-nodes", "show_nodes", default=True, show_default=True,
              help="Also list each node.")
@click.option("--backend", type=click.Choice(["cli", "pyslurm"]), default="cli",
              show_default=True, help="pyslurm is used for reads only if it matches Slurm.")
def cluster(partition: str | None, fmt: str, show_nodes: bool, backend: str) -> None:
    """Show a partition's GPU mix by type, node states and free GPUs (from sinfo)."""
    from rich.table import Table

    inv = load_inventory(_client(backend), _partition(partition))
    if fmt == "json":
        click.echo(json.dumps(inv.to_dict(), indent=2))
        return
    from hetsched.cli.tables import stdout_console

    console = stdout_console()
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
