"""The state file's journal follows its file system (state/fs.py): WAL on a local disk,
a rollback journal on NFS, Lustre, GPFS and the like, where WAL's shared-memory index
is not shared between the login nodes that open the file."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.errors import InputError
from hetsched.state import fs
from hetsched.state.store import open_store


def _mountinfo(root: Path) -> str:
    """A mountinfo text: / on overlay, ROOT/home on NFS (with an escaped space in a
    local mount below it), ROOT/scratch on Lustre stacked over an ext4 mount."""
    return "\n".join([
        "22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/l",
        f"30 22 0:40 / {root}/home rw,relatime shared:1 - nfs4 srv:/home rw,vers=4.2",
        f"31 30 8:17 / {root}/home/local\\040disk rw master:2 - ext4 /dev/sdb1 rw",
        f"32 22 8:33 / {root}/scratch rw - ext4 /dev/sdc1 rw",
        f"33 22 0:42 / {root}/scratch rw - lustre 10.0.0.1@o2ib:/fs rw,flock",
        f"34 22 0:43 / {root}/mnt rw - fuse.sshfs u@h:/ rw",
        "not a mountinfo line"])


def test_the_file_system_is_the_longest_mount_point_above_the_path(tmp_path: Path) -> None:
    for d in ("home/u", "home/local disk", "homebrew", "scratch", "mnt"):
        (tmp_path / d).mkdir(parents=True)
    text = _mountinfo(tmp_path)
    assert fs.filesystem_type(tmp_path / "home/u/state.db", text) == "nfs4"
    # not created yet, nor its folder: the nearest folder that exists decides
    assert fs.filesystem_type(tmp_path / "home/u/new/dir/state.db", text) == "nfs4"
    assert fs.filesystem_type(tmp_path / "home/local disk/s.db", text) == "ext4"
    assert fs.filesystem_type(tmp_path / "homebrew/s.db", text) == "overlay"  # not /home
    assert fs.filesystem_type(tmp_path / "scratch/s.db", text) == "lustre"  # the top mount
    (tmp_path / "home/u/link").symlink_to(tmp_path / "homebrew")
    assert fs.filesystem_type(tmp_path / "home/u/link/s.db", text) == "overlay"  # real path
    assert fs.journal_mode(tmp_path / "home/u/s.db", "auto", text)[0] == "delete"
    assert fs.journal_mode(tmp_path / "mnt/s.db", "auto", text)[0] == "delete"  # FUSE
    assert fs.journal_mode(tmp_path / "homebrew/s.db", "auto", text)[0] == "wal"
    assert fs.journal_mode(tmp_path / "home/u/s.db", "wal", text) == (
        "wal", "the state_journal setting")
    assert fs.journal_mode(tmp_path / "homebrew/s.db", "delete", text)[0] == "delete"
    assert fs.filesystem_type(tmp_path, "") is None  # nothing known: WAL, as before
    assert fs.journal_mode(tmp_path, "auto", "") == ("wal", "file system unknown")


@pytest.fixture
def on_nfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/home reads as an NFS mount (the real file system underneath)."""
    (tmp_path / "home").mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(_mountinfo(tmp_path))
    monkeypatch.setattr(fs, "MOUNTINFO", info)
    monkeypatch.delenv("HETSCHED_STATE_JOURNAL", raising=False)
    return tmp_path / "home"


def _mode(path: Path) -> str:
    import sqlite3

    conn = sqlite3.connect(str(path))
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def test_a_state_file_on_nfs_gets_a_rollback_journal(on_nfs: Path) -> None:
    path = on_nfs / "state.db"
    with open_store(path) as st:
        assert st.journal == "delete" and "nfs4" in st.journal_reason
        st.add_event("job-completed", job="a")
    assert _mode(path) == "delete"
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    with open_store(path) as st:  # reopened: the same data, the same journal
        assert [e["job"] for e in st.events()] == ["a"]


def test_a_wal_state_file_on_nfs_is_switched_when_opened_alone(
        on_nfs: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import sqlite3

    path = on_nfs / "state.db"
    monkeypatch.setenv("HETSCHED_STATE_JOURNAL", "wal")  # as an older hetsched made it
    with open_store(path) as st:
        st.add_event("job-completed", job="a")
    assert _mode(path) == "wal"
    monkeypatch.delenv("HETSCHED_STATE_JOURNAL")
    other = sqlite3.connect(str(path))  # another process has it open: no switch yet
    other.execute("SELECT count(*) FROM events").fetchone()
    log = logging.getLogger("hetsched.state.store")  # the CLI's logger may not propagate
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=log.name), open_store(path) as st:
            assert [e["job"] for e in st.events()] == ["a"]
            st.add_event("job-completed", job="b")
    finally:
        log.removeHandler(caplog.handler)
    assert "stays in wal mode" in caplog.text
    other.close()
    with open_store(path) as st:  # alone now: switched, nothing lost
        assert [e["job"] for e in st.events()] == ["a", "b"]
    assert _mode(path) == "delete"


WRITER = """
import sys
from hetsched.state.store import open_store
for k in range(40):
    with open_store(sys.argv[1]) as st:
        st.add_event("job-completed", job=f"{sys.argv[2]}-{k}")
"""


def test_two_processes_write_a_rollback_journal_state_file_without_loss(
        tmp_path: Path) -> None:
    """The rollback journal's locking (BEGIN IMMEDIATE, the busy timeout) under two real
    writer processes: every event is kept."""
    import os

    path = tmp_path / "state.db"
    env = {**os.environ, "HETSCHED_STATE_JOURNAL": "delete"}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name], env=env)
             for name in ("x", "y")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert _mode(path) == "delete"
    with open_store(path) as st:
        jobs = [e["job"] for e in st.events()]
    assert sorted(jobs) == sorted(f"{n}-{k}" for n in "xy" for k in range(40))


def test_a_bad_journal_setting_names_the_variable_and_the_choices(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HETSCHED_STATE_JOURNAL", "memory")
    with pytest.raises(InputError, match=r"HETSCHED_STATE_JOURNAL.*'memory' is not valid; "
                                         r"expected auto, wal, delete"):
        open_store(tmp_path / "s.db")
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_a_state_file_on_a_real_fuse_mount_gets_a_rollback_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real FUSE mount (bindfs, which `make test` installs as root on Debian): the
    journal is chosen from the kernel's own mountinfo, and two writers lose nothing."""
    import os
    import shutil

    if shutil.which("bindfs") is None or os.geteuid() != 0 or not Path("/dev/fuse").exists():
        pytest.skip("needs bindfs, root and /dev/fuse")
    monkeypatch.delenv("HETSCHED_STATE_JOURNAL", raising=False)  # auto: the mount decides
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    if subprocess.run(["bindfs", str(src), str(mnt)], capture_output=True).returncode:
        pytest.skip("this machine refuses FUSE mounts")
    try:
        path = mnt / "home" / "state.db"
        with open_store(path) as st:
            assert st.journal == "delete" and st.journal_reason.startswith("fuse")
            st.add_event("job-completed", job="a")
        env = {k: v for k, v in os.environ.items() if k != "HETSCHED_STATE_JOURNAL"}
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name], env=env)
                 for name in ("x", "y")]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        assert _mode(path) == "delete"
        with open_store(path) as st:
            assert len(st.events()) == 81
        out = subprocess.run([sys.executable, "-m", "hetsched", "state", "check", "--state",
                              str(path)], capture_output=True, text=True, env=env)
        assert out.returncode == 0 and "journal: delete (fuse" in out.stdout, out
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: also when busy


#: an LD_PRELOAD shim: every POSIX byte-range lock and flock fails with ENOLCK, as on an
#: NFS mount whose lock daemon is not running
NO_LOCKS_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
static int refused(int cmd) {
    return cmd == F_SETLK || cmd == F_SETLKW || cmd == F_GETLK
        || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW || cmd == F_OFD_GETLK;
}
static int pass(const char *name, int fd, int cmd, void *arg) {
    int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, name);
    return real(fd, cmd, arg);
}
int fcntl(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (refused(cmd)) { errno = ENOLCK; return -1; }
    return pass("fcntl", fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (refused(cmd)) { errno = ENOLCK; return -1; }
    return pass("fcntl64", fd, cmd, arg);
}
int flock(int fd, int op) { (void)fd; (void)op; errno = ENOLCK; return -1; }
"""


def test_lock_problem_is_none_where_locks_work(tmp_path: Path) -> None:
    assert fs.lock_problem(tmp_path) is None
    assert fs.lock_problem(tmp_path / "not" / "yet") is None  # its nearest folder's


@pytest.mark.slow
def test_a_file_system_without_locks_is_one_line_at_once_not_a_wait(tmp_path: Path) -> None:
    """Under a shim that refuses every lock (NFS without its lock daemon), each command
    that opens the state file says so in one line, exit 8, at once: SQLite alone reads
    ENOLCK as "busy", waits out its 30 s busy timeout and then read as corrupted."""
    import os
    import shutil
    import time

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the shim")
    src, lib = tmp_path / "nolocks.c", tmp_path / "nolocks.so"
    src.write_text(NO_LOCKS_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src), "-ldl"], check=True)
    existing = tmp_path / "old" / "state.db"
    with open_store(existing) as st:  # made where locks work, then the locks go away
        st.add_event("job-completed", job="a")
    new = tmp_path / "new" / "state.db"
    for args, state in ((["state", "check"], existing), (["status"], existing),
                        (["replan"], existing), (["profiles", "list"], new)):
        env = {**os.environ, "HETSCHED_STATE": str(state), "LD_PRELOAD": str(lib)}
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                             text=True, env=env, timeout=60)
        took = time.monotonic() - t0
        assert out.returncode == 8, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "refuses file locks" in lines[0], (args, out.stderr)
        assert "No locks available" in lines[0] and took < 20, (args, took)
    assert not new.exists() and not new.parent.exists()
    with open_store(existing) as st:  # untouched
        assert [e["job"] for e in st.events()] == ["a"]
    # the replan lock (flock) on such a file system: the same error, not a traceback
    code = ("import sys\nfrom hetsched.app.replan import replan_lock\n"
            "from hetsched.errors import HetschedError\ntry:\n"
            "    with replan_lock(sys.argv[1]):\n        print('locked')\n"
            "except HetschedError as e:\n    print(e.exit_code, e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "replan.lock")],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "LD_PRELOAD": str(lib)})
    assert out.stdout.startswith("8 cannot lock") and "refuses file locks" in out.stdout, out
