"""Private by construction: the folders hetsched creates are 0700 whatever the umask, and
a layout, plan or checkpoint another user could have written is refused (exit 11)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetsched.errors import EXIT_UNSAFE_FILE, UnsafeFileError
from hetsched.io.files import atomic_write, check_private, private_dir
from hetsched.io.layout import Layout, read_layout, write_layout
from tests.runtime.exec_helpers import MAIN, env, make_plan


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o002)  # a group-shared site's usual umask
    try:
        yield
    finally:
        os.umask(old)


def test_created_folders_are_0700_whatever_the_umask(tmp_path: Path, loose_umask: None) -> None:
    for umask in (0o002, 0o000, 0o022):
        os.umask(umask)
        top = tmp_path / f"u{umask:o}"
        private_dir(top / "a" / "b")
        assert [mode(p) for p in (top, top / "a", top / "a" / "b")] == [0o700] * 3
        atomic_write(top / "c" / "d" / "f.json", "{}")
        assert mode(top / "c") == mode(top / "c" / "d") == 0o700
        assert mode(top / "c" / "d" / "f.json") == 0o600
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    private_dir(mine / "x")
    assert mode(mine) == 0o755  # a folder that existed keeps its mode
    assert mode(mine / "x") == 0o700


def test_the_store_and_its_files_folder_are_private(tmp_path: Path, loose_umask: None) -> None:
    from hetsched.state.store import open_store

    st = open_store(tmp_path / "new" / "state.db")
    st.close()
    assert mode(tmp_path / "new") == 0o700
    assert mode(tmp_path / "new" / "state.db") == 0o600


def _layout(tmp: Path) -> Path:
    p = tmp / "layouts" / "job-0.json"
    write_layout(p, Layout(str(tmp / "plan.json"), "pid", "job", 0, (("v100", "n1", (4,)),)))
    return p


def test_a_group_writable_layout_is_refused(tmp_path: Path) -> None:
    p = _layout(tmp_path)
    assert read_layout(p).job == "job"
    p.chmod(0o664)  # what a group member needs to point the job at their own plan
    with pytest.raises(UnsafeFileError, match="job layout: the file is writable by its group"):
        read_layout(p)
    p.chmod(0o600)
    p.parent.chmod(0o770)  # or to replace the file in its folder
    with pytest.raises(UnsafeFileError, match="its folder .* is writable by its group"):
        read_layout(p)
    p.parent.chmod(0o777)
    with pytest.raises(UnsafeFileError, match="writable by others"):
        read_layout(p)
    p.parent.chmod(0o1777)  # sticky (as /tmp): nobody can replace another user's file
    assert read_layout(p).job == "job"
    p.parent.chmod(0o700)
    assert UnsafeFileError.exit_code == EXIT_UNSAFE_FILE == 11


def test_a_foreign_owner_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file someone else owns (we cannot chown without root: the uid we compare with
    is made another's)."""
    p = _layout(tmp_path)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(p).st_uid + 1)
    with pytest.raises(UnsafeFileError, match="the file is owned by uid"):
        check_private(p, "plan")


def test_a_group_writable_pool_plan_is_refused_by_exec(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=1)
    plan.chmod(0o664)
    r = subprocess.run([sys.executable, "-c", MAIN, "exec", "--plan", str(plan), "--local"],
                       env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == EXIT_UNSAFE_FILE, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused as a pool plan" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_bad_pool_checkpoint_is_one_line(tmp_path: Path) -> None:
    from hetsched.io.plan_json import load_plan
    from hetsched.runtime.checkpoint import CheckpointError
    from hetsched.runtime.executor.coordinator import JobServer
    from hetsched.runtime.executor.plan import exec_plan

    xp = exec_plan(load_plan(make_plan(tmp_path, gpus=2, task_iterations=1)))
    ck = tmp_path / "ck" / xp.plan_id
    private_dir(ck)
    job = next(iter(xp.jobs.values()))
    for content in (b"", b"garbage" * 10, b"PK\x03\x04truncated"):
        (ck / f"{job.name}.pt").write_bytes(content)
        with pytest.raises(CheckpointError, match="not a readable pool checkpoint") as e:
            JobServer(job, xp.plan_id, tmp_path / "ck", 0)
        assert "\n" not in str(e.value)
    (ck / f"{job.name}.pt").chmod(0o666)
    with pytest.raises(UnsafeFileError, match="pool checkpoint"):
        JobServer(job, xp.plan_id, tmp_path / "ck", 0)


def test_checkpoints_carried_to_a_replanned_plan_stay_private(tmp_path: Path,
                                                              loose_umask: None) -> None:
    from hetsched.app.pool_replan import carry_checkpoints
    from hetsched.runtime.elastic import write_request

    old = tmp_path / "ck" / "old"
    atomic_write(old / "a.pt", "x")
    atomic_write(old / "a.json", "{}")
    carry_checkpoints(tmp_path / "ck", "old", "new", ["a"])
    assert mode(tmp_path / "ck" / "new") == 0o700
    assert mode(tmp_path / "ck" / "new" / "a.pt") == mode(tmp_path / "ck" / "new" / "a.json") \
        == 0o600
    check_private(tmp_path / "ck" / "new" / "a.pt", "pool checkpoint")  # the executor's check
    write_request(tmp_path / "ck" / "job.pt.rescale.json", [2, 2])
    assert mode(tmp_path / "ck" / "job.pt.rescale.json") == 0o600
