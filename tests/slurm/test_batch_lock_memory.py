"""A user's submit and a cron replan take turns on the batch (app/batch_lock.py).

Before, a replan that ran in the middle of a submit saw the batch half submitted
(reproduced: with 2 of a 6-job batch queued it replanned "a1, a2, b0, b1" and
recorded that) and could change jobs whose followers were still to be submitted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from lock_helpers import a_replan_holding
from slurm_helpers import make_testbed_plan, throughput_rows

from hetsched.app import batch_lock
from hetsched.app.monitor import Monitor
from hetsched.app.replan import ReplanLocked, default_lock, replan, replan_lock
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import EXIT_LOCKED
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = (("v100-1", "v100", 4), ("v100-2", "v100", 4), ("t4-1", "t4", 4))


def _jobs(prefix: str, n: int) -> str:
    return "jobs:\n" + "".join(
        f"  - {{name: {prefix}{i}, workload: w, dataset_size: {20000 + 5000 * i}, epochs: 1, "
        f"global_batch: 64, gpu_types: [v100, t4], min_gpus: 1, max_gpus: 2, "
        f"command: [train]}}\n" for i in range(n))


def test_a_replan_in_the_middle_of_a_submit_is_turned_away(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    table = ThroughputTable(throughput_rows())
    with open_store(tmp_path / "s.db") as st:
        submit(make_testbed_plan(slurm, _jobs("a", 3)), st, slurm)
        slurm.schedule()
        Monitor(st, slurm).poll()
        slurm.finish(next(i for i in slurm.active() if slurm.jobs_by_id[i].state == "RUNNING"))
        seen: list[object] = []

        def cron(_jid: str) -> None:  # what `hetsched replan` under cron does, mid-batch
            if slurm.count("sbatch") == 5 and not seen:
                try:
                    with replan_lock(default_lock(st)):
                        seen.append(replan(st, slurm, table))
                except ReplanLocked as e:
                    seen.append(e)

        slurm.on_submit = cron
        res = submit(make_testbed_plan(slurm, _jobs("b", 6)), st, slurm)
        assert len(res.submitted) == 6
        [got] = seen
        assert isinstance(got, ReplanLocked) and got.exit_code == EXIT_LOCKED
        assert "another replan, submit or cancel is running: a submit (pid " in str(got)
        slurm.on_submit = None
        with replan_lock(default_lock(st)):  # next time round, the whole batch
            r = replan(st, slurm, table)
        seen_jobs = set(r.kept) | {n for n, _ in r.submitted} | {n for n, _ in r.updated}
        assert {f"b{i}" for i in range(6)} <= seen_jobs, r


def test_a_submit_waits_for_the_replan_that_holds_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    said: list[str] = []
    with open_store(tmp_path / "s.db") as st:
        t0 = time.monotonic()
        with a_replan_holding(st, 0.6):
            res = submit(make_testbed_plan(slurm, _jobs("c", 2)), st, slurm,
                         progress=said.append)
        assert len(res.submitted) == 2 and time.monotonic() - t0 > 0.3
        assert said[0].startswith("waiting for a replan (pid "), said
        # one that never ends: the submit gives up, nothing sent
        monkeypatch.setattr(batch_lock, "SUBMIT_WAIT_S", 0.3)
        before = slurm.count("sbatch")
        with replan_lock(default_lock(st)):
            with pytest.raises(ReplanLocked, match="nothing was submitted"):
                submit(make_testbed_plan(slurm, _jobs("d", 2)), st, slurm)
        assert slurm.count("sbatch") == before
