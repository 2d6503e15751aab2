"""With slurmctld stopped, every command that asks Slurm says it did not answer.

Slurm 22.05's ``squeue --json`` and ``sinfo --json`` exit 0 with an empty list
and an ``errors`` list when the controller is down: that is no answer, never
"no jobs" or "no nodes". Each command exits with EXIT_SLURM_DOWN, prints
"Slurm did not answer", and changes nothing (the job still runs, the state
file has the same rows).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import contract_plan, invoke, throughput_rows, wait_for

from hetsched.app.submit import submit
from hetsched.cli import slurm as cli_slurm
from hetsched.cli.replan import replan_cmd
from hetsched.cli.testbed import cluster as cluster_cmd
from hetsched.errors import EXIT_SLURM_DOWN
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import Runner, SlurmUnavailable
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm


def _rows(state: Path) -> list[tuple[str, str | None, str]]:
    with open_store(state) as st:
        return [(r.job, r.slurm_id, r.state) for r in st.submissions()]


def test_every_command_says_slurm_did_not_answer(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "s.db"
    with open_store(state) as st:
        ids = dict(submit(contract_plan("down1", {"d1": [[("t4-1", "t4", 4)]]}), st, client,
                          partition="gpu").submitted)
    wait_for(lambda: any(j.leader == ids["d1"] and j.state == "RUNNING" for j in client.jobs()),
             20, "d1 to run")
    rows = _rows(state)
    tp = tmp_path / "tp.csv"
    tp.write_text("workload,gpu_type,local_batch,step_time_s\n"
                  + "".join(f"{r.workload},{r.gpu_type},{r.local_batch},{r.step_time_s}\n"
                            for r in throughput_rows()))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(contract_plan("down2", {"d2": [[("t4-1", "t4", 4)]]}).to_json())
    # one attempt per command: each squeue/sinfo/scancel waits ~9 s for the controller
    monkeypatch.setattr(Runner, "__init__", _one_try(Runner.__init__))
    testbed.stop_controller()
    try:
        quick = CliSlurmClient(Runner(env=testbed.env(), timeout_s=30, retries=0))
        with pytest.raises(SlurmUnavailable, match="Slurm did not answer"):
            quick.jobs()
        with pytest.raises(SlurmUnavailable, match="Slurm did not answer"):
            quick.nodes("gpu")
        for cmd, args in ((cluster_cmd, []),
                          (cli_slurm.status_cmd, ["--state", str(state)]),
                          (cli_slurm.cancel_cmd, ["d1", "--state", str(state)]),
                          (cli_slurm.submit_cmd, [str(plan_file), "--state", str(state)]),
                          (replan_cmd, ["--state", str(state), "--force", "--throughputs", str(tp)])):
            code, out = invoke(cmd, args)
            assert code == EXIT_SLURM_DOWN and "Slurm did not answer" in out, (cmd.name, out)
            assert "exited 0" not in out, (cmd.name, out)  # exit status 0 is no success here
            assert _rows(state) == rows, cmd.name  # nothing recorded on a non-answer
    finally:
        testbed.start_controller()
        wait_for(lambda: testbed.runner.run(["scontrol", "ping"], check=False).returncode == 0,
                 30, "slurmctld to answer again")
    monkeypatch.undo()
    # the job ran on, untouched, and status sees it running again
    wait_for(lambda: any(j.leader == ids["d1"] and j.state == "RUNNING" for j in client.jobs()),
             30, "d1 to be seen running")
    code, out = invoke(cli_slurm.status_cmd, ["--state", str(state)])
    assert code == 0 and "RUNNING" in out, out


def _one_try(init):  # type: ignore[no-untyped-def]
    def wrapped(self, *a, **kw):  # type: ignore[no-untyped-def]
        init(self, *a, **kw)
        self.retries = 0
    return wrapped
