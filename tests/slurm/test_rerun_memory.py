"""Submitting the same plan again, on the in-memory Slurm (real plans, files, SQLite).

A plan's id is a hash of its content, so the same jobs file planned on the
same cluster gives the same plan. While that plan's batch is in flight a
second submit resumes it and sends nothing twice; once it ran to its end, a
second submit is a new batch of the same jobs, under the id ``PID.2``, whose
jobs train afresh (their own checkpoint and report folders). The testbed
test (test_rerun_tb.py) runs the same through the CLI on a real Slurm.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pool_slurm_helpers import pool_plan
from slurm_helpers import contract_plan

from hetsched.app.submit import submit
from hetsched.errors import InputError
from hetsched.io.jobfiles import BATCHES_KEY, JobFiles, plan_copy
from hetsched.io.plan_json import load_plan, plan_from_dict
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import SUBMITTING, open_store


def two_jobs(pid: str | None = "rr1"):
    return contract_plan(pid, {"A": [[("v100-1", "v100", 4)]], "B": [[("t4-1", "t4", 4)]]})


def test_same_plan_resumes_while_queued_and_runs_again_once_ended(tmp_path: Path) -> None:
    slurm = MemorySlurm()
    said: list[str] = []
    with open_store(tmp_path / "s.db") as st:
        first = submit(two_jobs(), st, slurm)
        ids = dict(first.submitted)
        assert first.plan_id == "rr1" and set(ids) == {"A", "B"}
        slurm.schedule()
        slurm.finish(ids["A"])  # B still runs: the batch is in flight

        again = submit(two_jobs(), st, slurm, progress=said.append)
        assert again.plan_id == "rr1" and again.submitted == []
        assert dict(again.skipped) == ids and said == []
        assert slurm.count("sbatch") == 2

        slurm.finish(ids["B"])  # the batch ran to its end (the store was never polled)
        second = submit(two_jobs(), st, slurm, progress=said.append)
        assert second.plan_id == "rr1.2" and sorted(j for j, _ in second.submitted) == ["A", "B"]
        assert not set(dict(second.submitted).values()) & set(ids.values())
        assert said[0] == "plan rr1 ran to its end before: submitting its jobs again as plan rr1.2"
        # its own plan copy, scripts and job folders: it trains afresh
        root = plan_copy(tmp_path / "s.db.files", "rr1.2")
        assert load_plan(root).plan_id == "rr1.2"
        a1 = JobFiles(tmp_path / "s.db.files", "rr1", "A", 0, "rr1")
        a2 = JobFiles.of(tmp_path / "s.db.files", load_plan(root), "A")
        assert a2.checkpoint != a1.checkpoint and a2.report != a1.report
        assert {s.plan_id for s in st.submissions()} == {"rr1", "rr1.2"}
        assert st.active_plan()["plan_id"] == "rr1.2"

        # the rerun in flight: resumed, not a third batch; ended: the third
        assert submit(two_jobs(), st, slurm).plan_id == "rr1.2"
        slurm.schedule()
        for _, jid in second.submitted:
            slurm.finish(jid)
        assert submit(two_jobs(), st, slurm).plan_id == "rr1.3"
        assert slurm.count("sbatch") == 6


def test_a_batch_cut_short_by_a_crash_resumes_under_its_own_id(tmp_path: Path) -> None:
    """Only A reached Slurm before the crash; A has ended since. The batch is not over:
    submit hands B over under the same plan, and never sends A again."""
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(two_jobs(), st, slurm).submitted)
        [b] = st.submissions(job="B")
        st.delete_submission(b.id)  # as if the crash came before B's sbatch
        slurm.cancel([ids["B"]])
        slurm.schedule()
        slurm.finish(ids["A"])
        res = submit(two_jobs(), st, slurm)
        assert res.plan_id == "rr1" and [j for j, _ in res.submitted] == ["B"]
        assert dict(res.skipped) == {"A": ids["A"]}


def test_an_unanswered_sbatch_resumes_under_its_own_id(tmp_path: Path) -> None:
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(two_jobs(), st, slurm).submitted)
        slurm.schedule()
        for jid in ids.values():
            slurm.finish(jid)
        [b] = st.submissions(job="B")
        st.set_state(b.id, SUBMITTING)
        st.conn.execute("UPDATE submissions SET slurm_id = NULL WHERE id = ?", (b.id,))
        assert submit(two_jobs(), st, slurm).plan_id == "rr1"


def test_a_batch_continued_by_a_replan_is_not_over(tmp_path: Path) -> None:
    """A's first submission ended, but a replan's plan runs A on: the original plan's
    batch is still in flight, so submitting it again is refused as before, not a new
    batch; once the replan's A ended too, it is a new batch."""
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(two_jobs(), st, slurm).submitted)
        slurm.schedule()
        d = contract_plan("rr1-replan", {"A": [[("t4-1", "t4", 4)]]}).to_dict()
        d[BATCHES_KEY] = {"A": "rr1"}  # as a replan's plan names the batch it continues
        cont = submit(plan_from_dict(d, "replan"), st, slurm, allow_active_elsewhere=True,
                      only={"A"})
        for jid in ids.values():
            slurm.finish(jid)
        with pytest.raises(InputError, match="already queued under plan rr1-replan"):
            submit(two_jobs(), st, slurm)  # as before reruns: replan changes a queued job
        assert slurm.count("sbatch") == 3
        slurm.schedule()
        slurm.finish(dict(cont.submitted)["A"])
        assert submit(two_jobs(), st, slurm).plan_id == "rr1.2"


def test_a_pool_plan_runs_again_once_ended(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    nodes = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]
    slurm = MemorySlurm(nodes_spec=nodes)
    plan = pool_plan(nodes, prefix="rp", task_iterations=5)
    with open_store(tmp_path / "s.db") as st:
        first = submit(plan, st, slurm, partition="gpu")
        pid = first.plan_id
        assert submit(plan, st, slurm, partition="gpu").submitted == []  # queued: resumed
        slurm.schedule()
        slurm.finish(first.slurm_id)
        second = submit(plan, st, slurm, partition="gpu")
        assert second.plan_id == f"{pid}.2" and second.slurm_id != first.slurm_id
        assert len(second.submitted) == len(plan.jobs)
