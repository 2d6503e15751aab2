"""``hetsched state check|backup|restore``: inspect the state file, back it up, restore it.

The state file (``HETSCHED_STATE``) remembers which Slurm jobs hetsched
submitted. Every command that changes it refreshes ``<state>.bak`` with
SQLite's backup API; ``restore`` puts that backup (or another) back, moving the
damaged file aside, never deleting it. Errors exit with the codes in
docs/reliability.md (6 corrupted, 7 read-only, 8 permission, 9 empty,
10 missing tables).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from hetsched.errors import InputError
from hetsched.state import guard
from hetsched.state.store import Store, StoreError, default_path, open_store


def _path(state: str | None) -> Path:
    return Path(state) if state else default_path()


state_option = click.option(
    "--state", "state", type=click.Path(), metavar="PATH",
    envvar="HETSCHED_STATE", show_envvar=True,
    help="State file (default: the `state` setting, see hetsched config show).")


@click.group("state")
def state_cmd() -> None:
    """The state file: check it, back it up, restore a backup."""


@state_cmd.command("check")
@state_option
def check_cmd(state: str | None) -> None:
    """Open the state file with every check; print what it holds and its backup."""
    p = _path(state)
    if not p.exists():
        click.echo(f"{p}: no state file yet (hetsched creates it on first use)")
        return
    with open_store(p) as st:
        counts = {t: st.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608
                  for t in ("plans", "submissions", "events", "replans")}
        version = st.schema_version
        journal = str(st.conn.execute("PRAGMA journal_mode").fetchone()[0])
        why = st.journal_reason
    bak = guard.backup_path(p)
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(bak.stat().st_mtime))
            if bak.exists() else "none")
    click.echo(f"{p}: ok (schema version {version}; "
               + ", ".join(f"{n} {t}" for t, n in counts.items()) + f"); backup: {when}; "
               f"journal: {journal} ({why})")


@state_cmd.command("backup")
@state_option
@click.option("--to", "dest", type=click.Path(dir_okay=False), metavar="PATH",
              help="Where to write the backup (default: <state>.bak).")
def backup_cmd(state: str | None, dest: str | None) -> None:
    """Copy the state file now with SQLite's online backup API (safe while others write)."""
    p = _path(state)
    if not p.exists():
        raise StoreError(f"no state file at {p}; nothing to back up")
    with open_store(p) as st:
        out = st.backup(dest)
    click.echo(f"backed up {p} -> {out}")


@state_cmd.command("restore")
@state_option
@click.option("--from", "source", type=click.Path(dir_okay=False), metavar="PATH",
              help="Backup to restore (default: <state>.bak).")
@click.option("--force", is_flag=True,
              help="Restore even though the current state file is healthy (its changes since "
                   "the backup are lost from the store; the file is kept aside).")
def restore_cmd(state: str | None, source: str | None, force: bool) -> None:
    """Put a backup in place of the state file; the old file is kept as <state>.damaged-*.

    A replan, submit or cancel acting on the batch is let finish first (said; at most
    5 minutes, then exit 75 with nothing restored): it would go on writing to the file
    set aside.
    """
    p = _path(state)
    src = Path(source) if source else guard.backup_path(p)
    if p.exists() and not force:
        try:
            open_store(p).close()
        except StoreError:
            pass
        except guard.StateReadOnly:
            raise
        except (guard.StateEmpty, guard.StateIncomplete, guard.StateAccessError):
            pass
        else:
            raise InputError("hetsched state restore", f"state file {p} is healthy; restoring "
                             f"{src} would drop what was recorded since; pass --force to "
                             "restore anyway")
    from hetsched.app.batch_lock import batch_turn
    from hetsched.cli import logs

    # not under a replan, submit or cancel: they would go on writing to the file set aside
    with batch_turn(p, "restore", logs.say):
        aside = guard.restore_backup(p, src, Store._check)
        with open_store(p):
            pass  # the normal checks, WAL mode and any migration
    kept = f"; the previous file is kept as {aside}" if aside else ""
    click.echo(f"restored {p} from {src}{kept}")
