"""A state file on a file system mounted read-only (a snapshot, a maintenance window):
commands that write say so in one line (chmod would not help), and the read-only
`status` still reads it. A real read-only bind mount, where the machine allows it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetsched.state.store import open_store, open_store_readonly


@pytest.fixture
def ro(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(source folder, its read-only bind mount)."""
    src, mnt = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", str(src), str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("needs root and a bind mount")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)],
                          capture_output=True).returncode:
            pytest.skip("the bind mount cannot be made read-only here")
        yield src, mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)  # lazy: also when busy


@pytest.mark.slow
def test_a_read_only_mount_is_named_and_status_still_reads(ro: tuple[Path, Path]) -> None:
    src, mnt = ro
    with open_store(src / "state.db") as st:  # written where it is writable, in WAL mode
        st.add_plan({"plan_id": "p1", "policy": "fifo", "jobs": []})
        assert st.journal == "wal"
    reader = open_store_readonly(mnt / "state.db")  # no -shm can be made there
    assert reader is not None
    try:
        assert [p["id"] for p in reader.plans()] == ["p1"]
    finally:
        reader.close()
    env = {**os.environ, "HETSCHED_STATE": str(mnt / "state.db")}
    # a restore takes the batch's lock first: its folder cannot be made there either
    for args in (["state", "check"], ["profiles", "list"], ["state", "restore", "--force"]):
        out = subprocess.run([sys.executable, "-m", "hetsched", *args], capture_output=True,
                             text=True, env=env, timeout=60)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 7 and len(lines) == 1, out.stderr
        assert "on a read-only file system" in lines[0] and "chmod" not in lines[0]
    assert sorted(p.name for p in src.iterdir()) == ["state.db", "state.db.bak"]
