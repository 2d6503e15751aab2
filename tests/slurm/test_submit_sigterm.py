"""SIGTERM in the middle of a submit: the batch is rolled back and the exit code is
143 (128 + SIGTERM), as docs/cli.md's table says; SIGINT's stays 130. SIGHUP (an ssh
session that drops) rolls back too, with 129: before, Python's default ended the
process mid-loop and left a partial batch queued. Under ``nohup`` (SIGHUP ignored)
the submit goes on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from slurm_helpers import contract_plan

from hetsched.app.submit import SubmitInterrupted, submit
from hetsched.errors import EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_TERMINATED
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

# SIGHUP reaches these tests as a terminal sends it (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("hangups_delivered")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, EXIT_TERMINATED),
                                      (signal.SIGINT, EXIT_INTERRUPTED),
                                      (signal.SIGHUP, EXIT_HANGUP)])
def test_signal_mid_submit_rolls_back_with_its_exit_code(tmp_path: Path, sig: int,
                                                         code: int) -> None:
    plan = contract_plan(f"sig{int(sig)}", {f"j{i:02d}": [[("v100-1", "v100", 4)]]
                                            for i in range(8)})
    slurm = MemorySlurm()
    slurm.on_submit = lambda jid: (os.kill(os.getpid(), sig)
                                   if slurm.count("sbatch") == 3 else None)
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(SubmitInterrupted, match=f"{signal.Signals(sig).name} after 3 of 8"
                           ) as e:
            submit(plan, st, slurm)
        assert e.value.exit_code == code
        assert st.submissions() == []
    assert slurm.active() == []


def test_a_hangup_under_nohup_is_ignored_and_the_batch_is_whole(tmp_path: Path) -> None:
    plan = contract_plan("nohup", {f"j{i:02d}": [[("v100-1", "v100", 4)]] for i in range(8)})
    slurm = MemorySlurm()
    slurm.on_submit = lambda jid: (os.kill(os.getpid(), signal.SIGHUP)
                                   if slurm.count("sbatch") == 3 else None)
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup does
    try:
        with open_store(tmp_path / "s.db") as st:
            res = submit(plan, st, slurm)
            assert len(res.submitted) == 8 and len(st.submissions()) == 8
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # left as it was
    finally:
        signal.signal(signal.SIGHUP, old)
    assert len(slurm.active()) == 8
