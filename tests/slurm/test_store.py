"""The SQLite state store: schema checks, refusal without overwriting, transactions."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from hetsched.state.store import SCHEMA_VERSION, StoreError, open_store

PLAN = {"plan_id": "p1", "policy": "fifo", "jobs": []}


def test_new_store_mode_wal_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    with open_store(path) as st:
        assert st.schema_version == SCHEMA_VERSION
        assert st.conn.execute("PRAGMA journal_mode").fetchone()[0] == st.journal  # fs.py
        tables = {r[0] for r in st.conn.execute("SELECT name FROM sqlite_master")}
        assert {"plans", "submissions", "events", "replans", "profiles", "meta"} <= tables
        st.add_plan(PLAN)
        st.put_profile("resnet-18", "t4", 32, 0.1, 0.01, "test")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open_store(path) as st:  # reopening keeps data
        assert st.active_plan() == PLAN
        assert st.profiles()[0]["gpu_type"] == "t4"


def test_corrupted_file_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    junk = b"this is not sqlite" * 200
    path.write_bytes(junk)
    with pytest.raises(StoreError, match="corrupted") as ei:
        open_store(path)
    assert "left untouched" in str(ei.value)
    assert path.read_bytes() == junk


def test_damaged_sqlite_pages_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with open_store(path) as st:
        for i in range(300):
            st.add_event("x", detail="y" * 200 + str(i))
        st.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw = bytearray(path.read_bytes())
    raw[4096 * 2: 4096 * 2 + 2000] = b"\xff" * 2000  # smash a b-tree page
    path.write_bytes(bytes(raw))
    with pytest.raises(StoreError):
        open_store(path)
    assert path.read_bytes() == bytes(raw)


def test_newer_schema_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with open_store(path) as st:
        st.conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                        (str(SCHEMA_VERSION + 1),))
        st.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer hetsched"):
        open_store(path)
    assert path.read_bytes() == before


def test_foreign_sqlite_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE t (x)")
    c.commit()
    c.close()
    with pytest.raises(StoreError, match="not a hetsched state file"):
        open_store(path)


def test_transaction_rolls_back(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as st:
        st.add_plan(PLAN)
        with pytest.raises(RuntimeError):
            with st.tx():
                sub = st.begin_submission("p1", "a", 0, "h", "", [])
                st.set_submitted(sub.id, "12")
                raise RuntimeError("crash mid-write")
        assert st.submissions() == []


def test_crash_mid_write_leaves_consistent_file(tmp_path: Path) -> None:
    """A process killed inside a transaction leaves the last committed state."""
    import subprocess
    import sys
    path = tmp_path / "s.db"
    with open_store(path) as st:
        st.add_plan(PLAN)
    code = (
        "import os, sys\n"
        "from hetsched.state.store import open_store\n"
        "st = open_store(sys.argv[1])\n"
        "with st.tx():\n"
        "    for i in range(50):\n"
        "        st.begin_submission('p1', f'j{i}', 0, 'h', '', [])\n"
        "    os._exit(9)\n"  # dies without commit or cleanup
    )
    res = subprocess.run([sys.executable, "-c", code, str(path)], check=False)
    assert res.returncode == 9
    with open_store(path) as st:
        assert st.submissions() == []
        assert st.active_plan() == PLAN
