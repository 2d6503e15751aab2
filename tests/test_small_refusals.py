"""Small refusals, each one line with its documented exit code: a FIFO as an input
file (read, never waited on; a device refused), a dangling-symlink state file (8, not "corrupted"), and a dry run that
fails where the real submit would (a state path with a space), and a testbed asked for by
a user other than root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.errors import EXIT_INPUT, EXIT_STATE_PERMISSION

ROOT = Path(__file__).resolve().parents[1]
MAIN = "import sys; from hetsched.cli.main import main; sys.argv[0] = \"hetsched\"; main()"


def run(*args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", MAIN, *args], capture_output=True,
                          text=True, env=env, timeout=120, pass_fds=pass_fds)


def one_line(r: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, r.stderr
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_a_fifo_as_the_jobs_file_is_read_not_waited_on(tmp_path: Path,
                                                        examples: dict[str, Path]) -> None:
    fifo = tmp_path / "jobs.yaml"
    os.mkfifo(fifo)  # nobody writes to it: a blocking open() would wait for ever
    one_line(run("plan", str(fifo)), EXIT_INPUT, str(fifo))  # read as empty, said at once
    # a pipe someone writes (what `hetsched plan <(...)` passes) is read as a file
    dev = tmp_path / "dev.yaml"
    os.symlink("/dev/zero", dev)
    one_line(run("plan", str(dev)), EXIT_INPUT, "not a regular file or a pipe")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer
        os.close(r)
        os.write(w, examples["jobs"].read_bytes())
        os._exit(0)
    os.close(w)
    try:
        ok = run("plan", f"/dev/fd/{r}", "--cluster", str(examples["cluster"]),
                 "--throughputs", str(examples["throughputs"]), "--format", "json",
                 pass_fds=(r,))
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert ok.returncode == 0, ok.stderr


def test_a_dangling_symlink_state_file_is_a_permission_problem_not_corruption(
        tmp_path: Path) -> None:
    st = tmp_path / "state.db"
    st.symlink_to(tmp_path / "gone" / "state.db")
    for args in (["status"], ["cancel", "--all"]):
        r = run(*args, "--state", str(st))
        one_line(r, EXIT_STATE_PERMISSION, "is a symbolic link to")
    assert not (tmp_path / "gone").exists()  # nothing created where the link points


def test_dry_run_fails_where_submit_fails(tmp_path: Path) -> None:
    from tests.runtime.exec_helpers import make_plan

    plan = make_plan(tmp_path, gpus=2, task_iterations=1)
    state = tmp_path / "with space" / "s.db"
    r = run("submit", str(plan), "--dry-run", "--state", str(state))
    one_line(r, EXIT_INPUT, "contains spaces")
    ok = run("submit", str(plan), "--dry-run", "--state", str(tmp_path / "s.db"))
    assert ok.returncode == 0, ok.stderr
    assert f"--plan {tmp_path}/s.db.files/plans/" in ok.stdout  # the real path
    assert "--key-file" in ok.stdout and not (tmp_path / "s.db.files").exists()


def test_testbed_up_as_another_user_says_it_needs_root(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Not root: one line before anything starts (slurmctld would stop at "Can not set
    uid to SlurmUser" and up would only quote its log)."""
    from hetsched.slurm.testbed import Testbed, TestbedError

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    tb = Testbed(tmp_path / "tb", nodes="t4:1x1")
    with pytest.raises(TestbedError, match="as root"):
        tb.up(timeout_s=1)
    assert not (tmp_path / "tb" / "etc").exists() and not any(tb.processes().values())


@pytest.mark.parametrize("name", ["with space", "hash#dir", "pct%n", "quo'te"])
def test_testbed_up_in_a_directory_slurm_conf_cannot_hold(tmp_path: Path, name: str) -> None:
    """One line, exit 2, nothing started: slurmctld had failed on its own config's parse
    errors (split at the blank) and left munged running."""
    r = run("testbed", "up", "--dir", str(tmp_path / name / "tb"))
    assert r.returncode == EXIT_INPUT, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("hetsched: error: --dir: ") and "slurm.conf" in line, line
    assert not (tmp_path / name / "tb" / "etc").exists()


def test_testbed_refuses_a_planted_tmp_folder(tmp_path: Path) -> None:
    """A deep DIR's slurmd spool goes in /tmp under a name anyone can guess: a link
    planted there is refused, never written through."""
    from hetsched.slurm.testbed import Testbed, TestbedError

    tb = Testbed(tmp_path / ("d" * 60) / ("e" * 60) / "tb", nodes="t4:1x1")
    target = tmp_path / "elsewhere"
    target.mkdir()
    spool, munge = tb.slurmd_spool, tb.munge_socket.parent
    assert not spool.is_relative_to(tb.dir) and not spool.exists()
    spool.symlink_to(target)
    try:
        with pytest.raises(TestbedError, match="not a folder of this user's"):
            tb.up(timeout_s=1)
        assert not list(target.iterdir()) and not any(tb.processes().values())
        spool.unlink()
        spool.mkdir(mode=0o700)
        spool.chmod(0o777)  # a folder of its own, but any user could write into it
        with pytest.raises(TestbedError, match="writable by others"):
            tb.up(timeout_s=1)
    finally:
        if spool.is_symlink():
            spool.unlink()
        shutil.rmtree(spool, ignore_errors=True)
        if not munge.is_relative_to(tb.dir):
            shutil.rmtree(munge, ignore_errors=True)
