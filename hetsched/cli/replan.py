"""``hetsched replan``: the cron-safe reaction to reset events (app/replan.py does the work)."""

from __future__ import annotations

import sys

import click

from hetsched.cli.options import format_option, partition_option, state_option
from hetsched.cli.slurm import _client, _partition, _spool, _store
from hetsched.errors import HetschedError


@click.command("replan")
@state_option
@click.option("--throughputs", default=None, type=click.Path(dir_okay=False),
              help="Profiles CSV (default: the state file's profiles table).")
@click.option("--policy", default=None, help="Policy (default: the active plan's).")
@partition_option("Partition (default: $HETSCHED_PARTITION).")
@click.option("--spool", type=click.Path(file_okay=False), default=None, envvar="HETSCHED_SPOOL",
              show_envvar=True, help="Directory of new jobs files "
              "(default: $HETSCHED_SPOOL); processed files move to SPOOL/done/.")
@click.option("--force", is_flag=True, help="Replan even without reset events.")
@click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--wait", "wait_s", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds to wait for another replan's lock before giving up (exit 75).")
@click.option("--max-failures", type=click.IntRange(0), default=2, show_default=True,
              help="Resubmit a failed job at most this many times.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="Log file (default: STATE.files/replan.log).")
@format_option("table", "json")
@click.option("--verbose", "-v", is_flag=True, help="Print even when nothing changed.")
def replan_cmd(state_path: str | None, throughputs: str | None, policy: str | None,
               partition: str | None, spool: str | None, force: bool, dry_run: bool,
               wait_s: float, max_failures: int, log_path: str | None, fmt: str,
               verbose: bool) -> None:
    """Replan after reset events and bring Slurm in line (cron-safe).

    Changes as little as it can: a pending job whose GPUs change is updated in
    place (scontrol update; same id and queue age) where Slurm allows it, else
    resubmitted; a running job moves only when that pays. Every change is
    printed as a table (job, was, now, why).

    Quiet unless something changed, a job was given up, or a spooled jobs file
    needs you (a job left out, rejected, kept waiting). Exit codes: 0 ok,
    1 unexpected error, 2 bad input, 3 a Slurm command failed, 4 Slurm unreachable, 6-10 state file
    unusable, 75 another replan, a submit or a cancel holds the lock (skipped). Example crontab:

    \b
        * * * * * eval "$(hetsched testbed env --dir D)"; hetsched replan --throughputs p.csv
    """
    from hetsched.app.plan import load_throughputs
    from hetsched.app.replan import (
        ReplanLocked,
        default_lock,
        default_log,
        file_logger,
        replan,
        replan_lock,
        result_json,
    )
    from hetsched.app.replan_changes import changes_table

    with _store(state_path) as st:
        log = file_logger(log_path or default_log(st))
        try:
            with replan_lock(default_lock(st), wait_s=wait_s):
                # a CSV is read at once (a wrong path fails now); the history only
                # when a plan is made: a pass with nothing to do needs no profiles
                csv = load_throughputs(throughputs) if throughputs else None
                res = replan(st, _client(), csv if csv is not None
                             else (lambda: load_throughputs(None, st)), policy=policy,
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
    if fmt == "json":
        click.echo(result_json(res))
    elif res.changed or res.status == "dry-run" or verbose or res.needs_user:
        click.echo(res.summary())
        if table:
            click.echo(table)
