"""The hetsched command line. Commands parse, call the library, render; nothing more."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from hetsched import __version__
from hetsched.cli.options import exit_codes_help, format_option, needs_extra, partition_option
from hetsched.cli.tables import stdout_console
from hetsched.errors import EXIT_FAILURE, EXIT_INTERRUPTED, HetschedError, InputError

DEFAULT_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

err_console = Console(stderr=True)


def _fail(e: HetschedError) -> None:
    try:
        click.echo(f"hetsched: error: {e}", err=True)
    except OSError:  # no terminal left to say it on (a hangup: EIO): the exit code says it
        pass
    sys.exit(e.exit_code)


#: optional dependencies and the extra that installs each (pyproject's optional-dependencies)
EXTRAS = {"torch": "runtime", "matplotlib": "plot", "pyslurm": "pyslurm"}


#: commands that live in their own modules, imported only when they run or when
#: ``--help`` lists them; those modules import their use cases inside each command, so
#: neither ``--help`` nor shell completion loads numpy, scipy or pydantic
#: (tests/test_lazy_imports.py)
LAZY_COMMANDS = {
    "submit": "hetsched.cli.slurm:submit_cmd",
    "status": "hetsched.cli.slurm:status_cmd",
    "watch": "hetsched.cli.slurm:watch_cmd",
    "cancel": "hetsched.cli.slurm:cancel_cmd",
    "replan": "hetsched.cli.replan:replan_cmd",
    "testbed": "hetsched.cli.testbed:testbed",
    "cluster": "hetsched.cli.testbed:cluster",
    "run": "hetsched.cli.runtime:run_cmd",
    "exec": "hetsched.cli.runtime:exec_cmd",
    "probe": "hetsched.cli.runtime:probe_cmd",
    "profile": "hetsched.cli.runtime:profile_cmd",
    "profiles": "hetsched.cli.profiles:profiles",
    "config": "hetsched.cli.config:config_cmd",
    "state": "hetsched.cli.state:state_cmd",
    "simulate": "hetsched.cli.simulate:simulate_cmd",
}


class Main(click.Group):
    """Turns every HetschedError into one line on stderr and its exit code.

    A missing optional dependency (torch for ``run``, matplotlib for PNGs)
    becomes one line naming the extra that installs it. Commands in other
    modules (``LAZY_COMMANDS``) are imported when first asked for.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            import importlib

            module, attr = LAZY_COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HetschedError as e:
            _fail(e)
        except click.NoSuchOption as e:
            if _is_global(e.option_name) and ctx.invoked_subcommand:
                # `hetsched plan ... -q`: say where the main options go
                e.message += (f" ({e.option_name} is an option of hetsched itself; put it "
                              f"before the command: hetsched {e.option_name} "
                              f"{ctx.invoked_subcommand} ...)")
            raise
        except OSError as e:
            from hetsched.io.files import NO_SPACE

            if e.errno not in NO_SPACE:
                raise
            # a full disk or quota under a job file, a plan copy, a report: one line
            click.echo(f"hetsched: error: cannot write {e.filename or 'a file'}: {e.strerror} "
                       "(the disk or your quota is full); free some space and run again",
                       err=True)
            sys.exit(EXIT_FAILURE)
        except KeyboardInterrupt:  # Ctrl-C: the documented 130, not click's "Aborted!" and 1
            click.echo("hetsched: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top not in EXTRAS:
                raise
            click.echo(f"hetsched: error: this command needs {top}, which is not installed; "
                       f"install it with: pip install 'hetsched[{EXTRAS[top]}]'", err=True)
            sys.exit(1)


def _is_global(option: str) -> bool:
    """-v, -vv, ..., -q, --verbose, --quiet: the main command's own options."""
    return option in ("-q", "--quiet", "--verbose") or (
        len(option) > 1 and option[0] == "-" and set(option[1:]) == {"v"})


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"],
                                         "max_content_width": 100}, epilog=exit_codes_help())
@click.version_option(__version__, prog_name="hetsched")
@click.option("--verbose", "-v", count=True,
              help="More detail on stderr: -v each step's decisions, -vv every Slurm command.")
@click.option("--quiet", "-q", is_flag=True, help="Errors only on stderr; no progress bars.")
def main(verbose: int, quiet: bool) -> None:
    """Plan deep-learning training batches on heterogeneous GPU partitions of Slurm.

    \b
    hetsched profile jobs.yaml          sbatch probes -> profile history (planner input)
    hetsched plan jobs.yaml --cluster cluster.yaml --throughputs profiles.csv
    hetsched submit plan.json           submit the plan as Slurm heterogeneous jobs
    hetsched replan                     cron-safe: react to reset events, resubmit
    hetsched status | watch             what Slurm runs for hetsched now
    hetsched cancel JOB... | --all      a user's cancel: final, never resubmitted
    hetsched testbed up --dir DIR       a local Slurm test cluster to try it all
    hetsched policies                   list placement policies and their parameters
    hetsched simulate trace.yaml ...    replay arrivals online, compare with the offline plan
    hetsched run --plan P --job J       inside a Slurm step: train with uneven shares
    hetsched exec --plan P              inside a pool job's step: run this GPU's tasks
    hetsched state check|backup|restore the state file: check, back up, restore
    hetsched config show                every setting, its value and where it came from

    -v says what each step decided, -vv every Slurm command, -q errors only.
    Errors in the input print one line naming the file and field; exit code 2
    (every exit code is listed below).
    """
    from hetsched.cli import logs

    logs.setup(verbose, quiet)


def write_output(path: str, text: str) -> None:
    """A file the user named, written whole or not at all (io/files.py)."""
    from hetsched.io.files import write_user_file

    write_user_file(path, text)


@main.command()
# Input paths are click.Path() without checks: completion offers files, and the loaders
# answer a directory or a missing file in one line (click's check is a three-line usage error).
@click.argument("jobs_file", metavar="JOBS.yaml", type=click.Path())
@click.option("--cluster", "cluster_file", metavar="CLUSTER.yaml", type=click.Path(),
              help="Cluster YAML (nodes, GPU types, bandwidths). Default: read the partition "
                   "from Slurm when one is reachable.")
@partition_option("Slurm partition to read when no --cluster is given.")
@click.option("--throughputs", "tp_file", metavar="PROFILES.csv", type=click.Path(),
              help="Throughput CSV: workload,gpu_type,local_batch,step_time_s[,sync_time_s]"
                   "[,max_local_batch].")
@click.option("--policy", default="auto", show_default=True,
              help="Placement policy (see `hetsched policies`); auto keeps the best candidate.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Policy parameter, repeatable (e.g. --param samples=60 --param seed=1).")
@click.option("--static", is_flag=True,
              help="Keep each job's first placement; freed GPUs only go to waiting jobs.")
@click.option("--restart-cost", type=click.FloatRange(min=0), default=None,
              help="Seconds a running job loses when its GPUs change (checkpoint, requeue, "
                   "reload). Default: the restart_cost_s setting ($HETSCHED_RESTART_COST), "
                   "60.")
@format_option("table", "json", "yaml")
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="Also write the plan JSON here.")
@click.option("--gantt", "gantt_png", type=click.Path(dir_okay=False),
              callback=needs_extra("matplotlib"),
              help="Write a per-GPU Gantt chart PNG here.")
@click.option("--no-gantt", is_flag=True, help="Do not print the text Gantt chart.")
@click.option("--dry-run", is_flag=True,
              help="Accepted for symmetry: planning never touches Slurm.")
@click.option("--mode", type=click.Choice(["space", "pool", "auto"]), default="space",
              show_default=True,
              help="space: each GPU serves one job at a time; pool: jobs share the GPUs task "
                   "by task (Hare; policies hare, pool-fifo, pool-srtf, pool-homo, pool-allox, "
                   "auto); auto: plan both, keep pool only where it predicts 2% less "
                   "weighted JCT than space.")
@click.option("--task-iterations", type=click.IntRange(min=1), default=None,
              help="Pool mode: iterations per task (default: per job, so a 5 ms task switch "
                   "costs < 1% of a task). A round's tasks accumulate their iterations' "
                   "gradients into one optimizer step: N global batches per step.")
@click.option("--skip-unplaceable", is_flag=True,
              help="Plan the jobs that fit this cluster; list the others (stderr and the "
                   "plan JSON's skipped_unplaceable) instead of refusing the batch.")
def plan(jobs_file: str, cluster_file: str | None, partition: str | None, tp_file: str | None,
         policy: str, params: tuple[str, ...], static: bool, restart_cost: float | None,
         fmt: str,
         out: str | None, gantt_png: str | None, no_gantt: bool, dry_run: bool,
         mode: str = "space", task_iterations: int | None = None,
         skip_unplaceable: bool = False) -> None:
    """Compute which GPUs each job gets, when, and each worker's local batch.

    Prints per job its GPUs by node, the local batch of each worker, predicted
    start, end and JCT; the plan's total weighted JCT, average JCT, makespan,
    Jain fairness and a lower bound with the gap to it; and a text Gantt
    chart. Exit code 2 on bad input.
    """
    from hetsched.app.plan import parse_params, plan_jobs_file, plan_settings
    from hetsched.cli import logs
    from hetsched.cli.pictures import png_gantt
    from hetsched.cli.progress import RichReporter
    from hetsched.cli.render import plan_yaml, render_plan

    settings = plan_settings(mode=mode, policy=policy, params=parse_params(params),
                             static=static, restart_cost_s=restart_cost,
                             task_iterations=task_iterations)
    with RichReporter(err_console, live=False if logs.quiet() else None) as reporter:
        result, inputs = plan_jobs_file(jobs_file, settings, cluster_file=cluster_file,
                                        partition=partition, tp_file=tp_file,
                                        skip_unplaceable=skip_unplaceable, reporter=reporter,
                                        warn=lambda m: click.echo(m, err=True))
    cluster, table = inputs.cluster, inputs.table
    from hetsched.io.profiles import coverage_warnings

    for warning in coverage_warnings(cluster.count_by_type(), table, cluster_file or "cluster"):
        logging.getLogger("hetsched").warning("%s", warning)
    if out:
        write_output(out, result.to_json() + "\n")
    if gantt_png:
        if result.mode == "pool":
            from hetsched.cli.render import png_gantt_pool

            png_gantt_pool(result, gantt_png)
        else:
            png_gantt(result, gantt_png)
    if fmt == "json":
        click.echo(result.to_json())
    elif fmt == "yaml":
        click.echo(plan_yaml(result), nl=False)
    elif result.mode == "pool":
        from hetsched.cli.render import render_pool_plan

        render_pool_plan(result, stdout_console(), gantt=not no_gantt)
    else:
        render_plan(result, stdout_console(), gantt=not no_gantt)


@main.command()
@format_option("table", "json")
def policies(fmt: str) -> None:
    """List every policy (space and pool mode) with its parameters and the paper it comes from."""
    from hetsched.planning.registry import listing

    rows = listing()
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    tab = Table(title="hetsched policies", show_lines=True)
    for col in ("policy", "what it does", "parameters (default)", "from"):
        tab.add_column(col)
    for r in rows:
        params = "\n".join(f"{k}: {v['type']} = {v['default']!r}: {v['doc']}"
                           for k, v in r["parameters"].items())
        extra = f"\n[dim]shares: {r['shares']}, moves running jobs: {r['preemptive']}[/dim]" \
            if r["shares"] != "-" else ""
        name = r["name"] + (" (--mode pool)" if r["mode"] == "pool" else "")
        tab.add_row(name, r["summary"] + extra, params or "-", r["paper"])
    stdout_console().print(tab)


@main.group()
def convert() -> None:
    """Convert public data (Gavel's throughputs and traces) into hetsched's formats."""


@convert.command("gavel-throughputs")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="CSV to write (default stdout).")
def convert_gavel(src: str, out: str | None) -> None:
    """Gavel's throughput JSON (iterations/s) -> throughput CSV (seconds per step).

    Uses the isolated measurements (no co-located job) of each '<Model>
    (batch size N)' job type at every scale factor, and keeps the pairs
    measured sharing one GPU as 'colocated_with' rows (Harmony's groups use
    them); workload keys are the model names in lower case (resnet-18,
    resnet-50, transformer, lm, recommendation).
    """
    import io

    from hetsched.io.profiles import load_gavel, write_csv

    buf = io.StringIO()
    write_csv(load_gavel(src), buf)
    if out:
        write_output(out, buf.getvalue())
    else:
        click.echo(buf.getvalue(), nl=False)


@convert.command("gavel-trace")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="jobs YAML to write (default stdout).")
@click.option("--limit", type=click.IntRange(min=1), help="Keep only the first N jobs.")
def convert_trace(src: str, out: str | None, limit: int | None) -> None:
    """A Gavel job trace -> jobs YAML (epochs=1, dataset = steps x per-worker batch)."""
    import yaml

    from hetsched.io.traces import parse_trace

    jobs, skipped = parse_trace(src, limit)
    text = yaml.safe_dump({"jobs": jobs}, sort_keys=False)
    if out:
        write_output(out, text)
    else:
        click.echo(text, nl=False)
    if skipped:
        click.echo(f"skipped {skipped} job(s) without a batch size (A3C, CycleGAN)", err=True)


@convert.command("philly-trace")
@click.option("--throughputs", required=True, type=click.Path(dir_okay=False),
              help="Profile CSV with multi-GPU v100 rows (examples/gavel_throughputs.csv).")
@click.option("--gpus", required=True, type=click.IntRange(min=1),
              help="GPUs of the partition the offered load is relative to.")
@click.option("--jobs", "-n", "n", default=60, show_default=True,
              type=click.IntRange(min=1, max=100_000), help="Jobs to draw.")
@click.option("--load", default=1.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Offered load: V100 GPU-seconds asked per second / --gpus.")
@click.option("--seed", default=0, show_default=True, type=int, help="Same seed, same trace.")
@click.option("--diurnal", default=0.0, show_default=True, type=click.FloatRange(0, 1, max_open=True),
              help="Day-period rate modulation (an assumption: no published Philly number).")
@click.option("--out", "-o", type=click.Path(dir_okay=False), help="jobs YAML to write (default stdout).")
def convert_philly(throughputs: str, gpus: int, n: int, load: float, seed: int, diurnal: float,
                   out: str | None) -> None:
    """Published Philly statistics -> a seeded synthetic jobs YAML."""
    import yaml

    from hetsched.io.files import read_text
    from hetsched.io.philly import philly_jobs
    from hetsched.io.profiles import parse_csv

    rows = parse_csv(read_text(Path(throughputs), "a throughput CSV"), throughputs)
    try:
        jobs = philly_jobs(rows, n, gpus=gpus, load=load, seed=seed, diurnal=diurnal)
    except ValueError as e:
        raise InputError(throughputs, str(e)) from None
    text = yaml.safe_dump({"jobs": jobs}, sort_keys=False)
    if out:
        write_output(out, text)
    else:
        click.echo(text, nl=False)
