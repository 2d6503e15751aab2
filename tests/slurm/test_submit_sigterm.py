"""SIGTERM in the middle of a submit: the batch is rolled back and the exit code is
143 (128 + SIGTERM), as docs/cli.md's table says; SIGINT's stays 130."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from slurm_helpers import contract_plan

from hetsched.app.submit import SubmitInterrupted, submit
from hetsched.errors import EXIT_INTERRUPTED, EXIT_TERMINATED
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, EXIT_TERMINATED),
                                      (signal.SIGINT, EXIT_INTERRUPTED)])
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
