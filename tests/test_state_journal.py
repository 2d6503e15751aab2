"""The state file's journal follows its file system (state/fs.py): WAL on a local disk,
a rollback journal on NFS, Lustre, GPFS and the like, where WAL's shared-memory index
is not shared between the login nodes that open the file."""

from __future__ import annotations

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
    with open_store(path) as st:
        assert [e["job"] for e in st.events()] == ["a"]
        st.add_event("job-completed", job="b")
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
def test_a_state_file_on_a_real_fuse_mount_gets_a_rollback_journal(tmp_path: Path) -> None:
    """A real FUSE mount (bindfs, which `make test` installs as root on Debian): the
    journal is chosen from the kernel's own mountinfo, and two writers lose nothing."""
    import os
    import shutil

    if shutil.which("bindfs") is None or os.geteuid() != 0 or not Path("/dev/fuse").exists():
        pytest.skip("needs bindfs, root and /dev/fuse")
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
        subprocess.run(["umount", str(mnt)], check=False)
