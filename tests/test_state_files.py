"""Every way the state file can be unusable has its own message and exit
code, nothing is written to a refused file, and a backup (SQLite's backup API) restores it.

Runs the real CLI in subprocesses against real SQLite files.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.errors import (
    EXIT_INPUT,
    EXIT_STATE_CORRUPT,
    EXIT_STATE_EMPTY,
    EXIT_STATE_INCOMPLETE,
    EXIT_STATE_PERMISSION,
    EXIT_STATE_READONLY,
)
from hetsched.state.store import open_store

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
CLI = "from hetsched.cli.main import main; main()"


def cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HETSCHED_STATE": str(state)}
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    p = tmp_path / "state.db"
    with open_store(p) as st:
        st.add_plan({"plan_id": "p1", "policy": "x"})
        sub = st.begin_submission("p1", "job-a", 0, "h", "", [])
        st.set_submitted(sub.id, "4242")
    return p


def refused(r: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_every_write_leaves_a_backup_that_holds_it(state: Path) -> None:
    bak = state.with_name("state.db.bak")
    assert bak.exists() and oct(bak.stat().st_mode & 0o777) == "0o600"
    with sqlite3.connect(bak) as c:
        assert c.execute("SELECT slurm_id FROM submissions").fetchall() == [("4242",)]


def test_zero_byte_file_refused_and_restored(state: Path) -> None:
    state.write_bytes(b"")
    # any command that opens the store (here: plan reading the profile history)
    r = cli(state, "plan", str(EX / "jobs.yaml"), "--cluster", str(EX / "cluster.yaml"))
    refused(r, EXIT_STATE_EMPTY, str(state), "empty (0 bytes)", "hetsched state restore")
    assert state.stat().st_size == 0  # untouched: not replaced by an empty store
    r = cli(state, "state", "check")
    refused(r, EXIT_STATE_EMPTY, "empty")
    r = cli(state, "state", "restore")
    assert r.returncode == 0, r.stderr
    aside = [p for p in state.parent.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].stat().st_size == 0  # the old file is kept
    with open_store(state) as st:  # the queued job is remembered again
        assert [s.slurm_id for s in st.submissions()] == ["4242"]
    r = cli(state, "state", "check")
    assert r.returncode == 0 and "1 submissions" in r.stdout, r.stdout


@pytest.mark.parametrize("mode", [0o444, 0o400])
def test_read_only_file_is_not_called_corrupted(state: Path, mode: int) -> None:
    before = digest(state)
    state.chmod(mode)
    try:
        r = cli(state, "state", "check")
        line = refused(r, EXIT_STATE_READONLY, str(state), "read-only", f"{mode:04o}",
                       "chmod u+w")
        assert "corrupt" not in line.replace("not corrupted", "")
        r = cli(state, "state", "restore")  # restoring would not help: the same message
        refused(r, EXIT_STATE_READONLY, "read-only")
    finally:
        state.chmod(0o600)
    assert digest(state) == before


@pytest.mark.parametrize("mode", [0o000, 0o200])
def test_unreadable_file(state: Path, mode: int) -> None:
    state.chmod(mode)
    try:
        r = cli(state, "state", "check")
        refused(r, EXIT_STATE_PERMISSION, str(state), "permission denied")
    finally:
        state.chmod(0o600)


def test_dropped_table_named_and_restored(state: Path) -> None:
    c = sqlite3.connect(state)
    c.execute("DROP TABLE submissions")
    c.commit()
    c.close()  # the last connection checkpoints the WAL into the file
    before = digest(state)
    r = cli(state, "state", "check")
    refused(r, EXIT_STATE_INCOMPLETE, str(state), "'submissions'", "hetsched state restore")
    assert digest(state) == before
    r = cli(state, "state", "restore")
    assert r.returncode == 0, r.stderr
    with open_store(state) as st:
        assert [s.slurm_id for s in st.submissions()] == ["4242"]


def test_corrupted_file_keeps_its_own_code(state: Path) -> None:
    state.write_bytes(b"not sqlite at all" * 100)
    refused(cli(state, "state", "check"), EXIT_STATE_CORRUPT, "corrupted")


@pytest.mark.parametrize("command", [("state", "check"), ("status",), ("replan",)])
def test_corrupted_file_names_its_backup_whichever_command_reads_it(
        state: Path, command: tuple[str, ...]) -> None:
    r = cli(state, "state", "backup")
    assert r.returncode == 0, r.stderr
    state.write_bytes(b"not sqlite at all" * 100)
    line = refused(cli(state, *command), EXIT_STATE_CORRUPT, "corrupted", str(state),
                   "hetsched state restore")
    assert "no backup" not in line
    state.with_name(state.name + ".bak").unlink()
    refused(cli(state, *command), EXIT_STATE_CORRUPT, "no backup exists")


def test_restore_refuses_to_replace_a_healthy_file(state: Path, tmp_path: Path) -> None:
    r = cli(state, "state", "restore")
    refused(r, EXIT_INPUT, "healthy", "--force")
    r = cli(state, "state", "backup", "--to", str(tmp_path / "copy.db"))
    assert r.returncode == 0, r.stderr
    with open_store(state) as st:
        st.add_event("later")
    r = cli(state, "state", "restore", "--from", str(tmp_path / "copy.db"), "--force")
    assert r.returncode == 0, r.stderr
    with open_store(state) as st:
        assert not [e for e in st.events() if e["kind"] == "later"]


def test_restore_refuses_a_bad_backup(state: Path, tmp_path: Path) -> None:
    state.write_bytes(b"")
    bad = tmp_path / "bad.db"
    with sqlite3.connect(bad) as c:
        c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        c.execute("INSERT INTO meta VALUES ('application', 'hetsched'), ('schema_version', '2')")
    r = cli(state, "state", "restore", "--from", str(bad))
    refused(r, EXIT_STATE_INCOMPLETE, str(bad))
    assert state.stat().st_size == 0  # nothing moved


def test_state_file_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    r = cli(blocker / "state.db", "state", "backup")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    r = cli(blocker / "state.db", "plan", str(EX / "jobs.yaml"), "--cluster",
            str(EX / "cluster.yaml"))
    assert "Traceback" not in r.stderr and r.returncode == 2, r.stderr  # no profile history
    from hetsched.state.guard import StateAccessError

    with pytest.raises(StateAccessError, match="cannot create state file"):
        open_store(blocker / "state.db")


def test_a_folder_named_like_a_uri_part_is_read_as_a_folder(tmp_path: Path) -> None:
    """The read-only opens (status, restore's check) go through a ``file:`` URI: a folder
    named ``#1`` or ``a?b`` had been read as the URI's fragment or query, so status
    opened another file and said nothing was ever submitted."""
    from hetsched.state.store import open_store, open_store_readonly

    d = tmp_path / "my #1 project?x%20y"
    d.mkdir()
    with open_store(d / "state.db") as st:
        st.add_plan({"plan_id": "p1", "policy": "fifo", "jobs": []})
        st.backup()
    reader = open_store_readonly(d / "state.db")
    assert reader is not None
    try:
        assert [p["id"] for p in reader.plans()] == ["p1"]
    finally:
        reader.close()
    res = cli(d / "state.db", "state", "restore", "--force")
    assert res.returncode == 0 and "restored" in res.stdout, res.stderr


def test_restore_waits_for_a_replan_that_holds_the_batch(state: Path, tmp_path: Path) -> None:
    """A replan (or submit, or cancel) writing to the batch would go on writing to the
    file the restore sets aside: the restore waits for it, saying so."""
    import time

    from lock_helpers import a_replan_holding

    r = cli(state, "state", "backup", "--to", str(tmp_path / "copy.db"))
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    with a_replan_holding(state, 3):
        r = cli(state, "state", "restore", "--from", str(tmp_path / "copy.db"), "--force")
    assert r.returncode == 0, r.stderr
    assert f"waiting for a replan (pid {os.getpid()}), which holds the batch's lock" \
        in r.stderr
    assert time.monotonic() - t0 > 1.5  # it did wait for the replan to end
    assert "restored" in r.stdout
