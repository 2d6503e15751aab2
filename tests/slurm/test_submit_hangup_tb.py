"""The ssh connection drops in the middle of a 30-job `hetsched submit` on a login node.

The terminal hangs up: the kernel sends SIGHUP to the command, and every later
write to the terminal fails (EIO). Before, Python's default for SIGHUP ended the
process between two sbatches, and even with the signal held, the next progress
line's EIO ended the loop without the rollback: either way the first jobs of the
batch stayed queued and the rest were never submitted. Now the batch is rolled
back: nothing from the run remains queued, and the state file has no row of it.
Under ``nohup`` the hangup is ignored and the whole batch goes in.

A reader that goes away with no hangup (``hetsched submit plan.json 2>&1 | head -2``)
made the next progress line fail with EPIPE: before, that too ended the loop and left
the first jobs queued (3 of 30). A progress line is not the work: now the line is
lost and the whole batch goes in.
"""

from __future__ import annotations

import errno
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, wait_for

from hetsched.app.submit import SubmitInterrupted, submit
from hetsched.errors import EXIT_HANGUP
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.memory import MemorySlurm
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

# SIGHUP reaches these tests as a terminal sends it (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("hangups_delivered")


def _tagged(client: CliSlurmClient, pid: str) -> list:
    return [j for j in client.jobs() if j.comment.startswith(f"hetsched:{pid}:")]


def _submit_argv(tmp_path: Path, pid: str) -> list[str]:
    """The real CLI submitting a 30-job plan ``pid`` (state file ``tmp_path/s.db``)."""
    plan = contract_plan(pid, {f"{pid}-{i:02d}": [[("v100-1", "v100", 4)]] for i in range(30)})
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    return [sys.executable, "-c", "from hetsched.cli.main import main; main()", "submit",
            str(pf), "--state", str(tmp_path / "s.db"), "-p", "gpu"]


@pytest.mark.slurm
def test_a_dropped_ssh_session_mid_submit_leaves_nothing_queued(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    argv = _submit_argv(tmp_path, "hup-tb")
    pid, fd = pty.fork()  # the command's terminal, as an ssh session gives it
    if pid == 0:  # never return into pytest from the forked child
        try:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a login shell's, not nohup's
            os.execv(sys.executable, argv)
        finally:
            os._exit(127)
    seen, deadline = b"", time.monotonic() + 60
    while seen.count(b"submitted ") < 3 and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                seen += os.read(fd, 4096)
            except OSError as e:  # the child ended early: its output tells why
                assert e.errno == errno.EIO
                break
    os.close(fd)  # the connection drops: the terminal hangs up under the command
    _, status = os.waitpid(pid, 0)
    assert seen.count(b"submitted ") >= 3, seen
    assert os.waitstatus_to_exitcode(status) == EXIT_HANGUP, seen
    wait_for(lambda: all(j.finished for j in _tagged(client, "hup-tb")), 20,
             "the submitted jobs to be cancelled")
    with open_store(tmp_path / "s.db") as st:
        assert st.submissions() == []


@pytest.mark.slurm
def test_a_reader_gone_mid_submit_loses_the_lines_not_the_batch(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    proc = subprocess.Popen(_submit_argv(tmp_path, "pipe-tb"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = [proc.stderr.readline() for _ in range(2)]  # what `| head -2` reads
    proc.stderr.close()  # ... before it exits
    assert proc.wait(timeout=120) == 0, lines
    with open_store(tmp_path / "s.db") as st:
        assert len(st.submissions()) == 30
    assert len([j for j in _tagged(client, "pipe-tb") if not j.finished]) == 30


def test_eio_on_the_terminal_after_a_hangup_still_rolls_back(tmp_path: Path) -> None:
    """The signal is held until the sbatch in flight is recorded; the progress line
    after it is where a hung-up terminal fails."""
    plan = contract_plan("hup-eio", {f"j{i:02d}": [[("v100-1", "v100", 4)]] for i in range(8)})
    slurm = MemorySlurm()
    slurm.on_submit = lambda jid: (os.kill(os.getpid(), signal.SIGHUP)
                                   if slurm.count("sbatch") == 3 else None)

    def progress(line: str) -> None:
        if slurm.count("sbatch") >= 3:
            raise OSError(errno.EIO, "Input/output error")

    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(SubmitInterrupted, match="SIGHUP after 3 of 8") as e:
            submit(plan, st, slurm, progress=progress)
        assert e.value.exit_code == EXIT_HANGUP
        assert st.submissions() == []
    assert slurm.active() == []


def test_any_failure_between_two_sbatches_rolls_back(tmp_path: Path) -> None:
    """Not only sbatch's own failure: a progress line that cannot be written, with no
    signal, stops the loop too; what this run had queued is cancelled."""
    plan = contract_plan("eio", {f"j{i:02d}": [[("v100-1", "v100", 4)]] for i in range(8)})
    slurm = MemorySlurm()

    def progress(line: str) -> None:
        if slurm.count("sbatch") == 4:
            raise OSError(errno.EIO, "Input/output error")

    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(OSError):
            submit(plan, st, slurm, progress=progress)
        assert st.submissions() == []
    assert slurm.active() == [] and slurm.count("sbatch") == 4
