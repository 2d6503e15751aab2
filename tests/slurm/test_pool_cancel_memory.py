"""Cancelling one job of a pool, on the in-memory Slurm (real plans, files, SQLite).

A pool plan's jobs all run in one Slurm job. `hetsched cancel JOB` drops that
job: the pool's Slurm job goes on, the job is final (cancelled), and the next
replan restarts the pool from its checkpoints without it. Cancelling every
job of the pool cancels its Slurm job.
"""

from __future__ import annotations

from pathlib import Path

from pool_slurm_helpers import emulated_rows, pool_plan

from hetsched.app.cancel import cancel_jobs
from hetsched.app.pool_submit import submit_pool
from hetsched.app.replan import latest_rows, replan
from hetsched.app.status import batch_status
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import CANCELLED, open_store

NODES = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]


def test_one_job_of_a_pool_is_dropped_and_the_pool_replanned_without_it(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = pool_plan(NODES, prefix="pc", task_iterations=5)
    a, b, c = (j.name for j in plan.jobs)
    with open_store(tmp_path / "s.db") as st:
        res = submit_pool(plan, st, slurm, partition="gpu")
        pool_id = res.slurm_id
        slurm.schedule()
        assert slurm.jobs_by_id[pool_id].state == "RUNNING"

        out = cancel_jobs(st, slurm, [b], reason="wrong data")
        assert out.dropped == [(b, pool_id)] and out.cancelled == []
        assert slurm.count("scancel") == 0  # the pool goes on
        rows = latest_rows(st)
        assert rows[b].state == CANCELLED and rows[a].state != CANCELLED
        shown = {j.job: j for j in batch_status(st, slurm)}
        assert shown[b].state == CANCELLED and "wrong data" in shown[b].reason
        assert shown[a].state == "RUNNING"

        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert r.status == "replanned", r.summary()
        assert b in r.user_cancelled
        assert {n for n, _ in r.submitted} == {a, c}
        new = st.active_plan()
        assert new is not None and {j["name"] for j in new["jobs"]} == {a, c}
        assert slurm.jobs_by_id[pool_id].state == "CANCELLED"  # the old pool job
        rows = latest_rows(st)
        assert rows[b].state == CANCELLED and rows[b].slurm_id == pool_id  # on record
        assert rows[a].slurm_id != pool_id

        # a second replan does not bring it back
        r2 = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert b not in {n for n, _ in r2.submitted}


def test_cancelling_every_job_of_a_pool_cancels_its_slurm_job(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = pool_plan(NODES, prefix="pa", task_iterations=5)
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        out = cancel_jobs(st, slurm, None)
        assert out.dropped == [] and {j for j, _ in out.cancelled} == {j.name for j in plan.jobs}
        assert slurm.jobs_by_id[pool_id].state == "CANCELLED"


def test_pool_failures_count_across_its_replans_and_not_into_a_later_batch(
        tmp_path: Path, monkeypatch) -> None:
    """max_failures 1: a pool that fails twice (the second time as its replan) is given up;
    a later pool reusing the job names starts from no failures."""
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    table = ThroughputTable(emulated_rows())
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(pool_plan(NODES, prefix="pf", task_iterations=5), st, slurm,
                              partition="gpu").slurm_id
        names = {j.name for j in pool_plan(NODES, prefix="pf", task_iterations=5).jobs}
        slurm.schedule()
        slurm.finish(pool_id, "FAILED")
        r = replan(st, slurm, table, partition="gpu", max_failures=1)
        assert {n for n, _ in r.submitted} == names, r.summary()
        slurm.schedule()
        slurm.finish(dict(r.submitted)[min(names)], "FAILED")
        r = replan(st, slurm, table, partition="gpu", max_failures=1)
        assert sorted(r.given_up) == sorted(names) and r.submitted == [], r.summary()

        later = pool_plan(NODES, prefix="pf", task_iterations=6)  # a new batch, same names
        later_id = submit_pool(later, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        slurm.finish(later_id, "FAILED")
        r = replan(st, slurm, table, partition="gpu", max_failures=1)
        assert r.given_up == [] and {n for n, _ in r.submitted} == names, r.summary()


def test_a_spooled_file_is_not_taken_into_a_pool_and_that_is_said(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    spool = tmp_path / "spool"
    spool.mkdir()
    with open_store(tmp_path / "s.db") as st:
        submit_pool(pool_plan(NODES, prefix="ps", task_iterations=5), st, slurm,
                    partition="gpu")
        slurm.schedule()
        (spool / "more.yaml").write_text("jobs: []\n")
        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu", spool=spool)
        assert r.status == "unchanged" and r.spool_untaken == [str(spool / "more.yaml")]
        assert "spool: not taken yet: " in r.summary() and "pool has ended" in r.summary()
        assert (spool / "more.yaml").exists()  # left where the user put it


def test_once_a_pool_has_ended_the_spool_starts_a_space_plan(tmp_path: Path) -> None:
    """A jobs file spooled while a pool runs waits in the spool; once every pool job has
    ended, the next replan takes it as a space plan, and the pool's jobs stay done."""
    slurm = MemorySlurm(nodes_spec=NODES)
    spool = tmp_path / "spool"
    spool.mkdir()
    table = ThroughputTable(emulated_rows())
    plan = pool_plan(NODES, prefix="pe", task_iterations=5)
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        job = plan.jobs[0]
        spec = job.spec
        assert spec is not None
        (spool / "later.yaml").write_text(
            f"jobs:\n  - {{name: later, workload: {spec.workload}, dataset_size: "
            f"{spec.dataset_size}, epochs: 1, global_batch: {spec.global_batch}, "
            "command: [train]}\n")
        r = replan(st, slurm, table, partition="gpu", spool=spool)
        assert r.spool_untaken and (spool / "later.yaml").exists()
        slurm.finish(pool_id)
        replan(st, slurm, table, partition="gpu", spool=spool)  # sees the pool end
        r = replan(st, slurm, table, partition="gpu", spool=spool)
        assert [j for j, _ in r.submitted] == ["later"], r.summary()
        assert (spool / "done" / "later.yaml").exists()
        active = st.active_plan()
        assert active is not None and active["mode"] == "space"
        assert {j.name for j in plan.jobs} <= set(r.done)


def test_a_pool_scancelled_while_a_replan_plans_is_not_submitted_again(
        tmp_path: Path, monkeypatch) -> None:
    """The user drops one job, then, while the replan that restarts the pool without it
    plans, cancels the whole pool with a plain ``scancel``: it stays cancelled (before,
    the replan submitted the pool again)."""
    from hetsched.app import pool_replan

    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = pool_plan(NODES, prefix="ps", task_iterations=5)
    a, b, c = (j.name for j in plan.jobs)
    real = pool_replan._new_plan
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        cancel_jobs(st, slurm, [b], reason="wrong data")

        def planning(*args, **kw):  # the user gives up on the whole pool meanwhile
            slurm.cancel([pool_id])
            return real(*args, **kw)

        monkeypatch.setattr(pool_replan, "_new_plan", planning)
        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        monkeypatch.setattr(pool_replan, "_new_plan", real)
        assert r.status == "unchanged" and "ended while this replan planned" in r.reason
        assert r.submitted == [] and slurm.active() == []
        r2 = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert r2.submitted == [] and slurm.active() == []
        rows = latest_rows(st)
        assert {rows[n].state for n in (a, b, c)} == {CANCELLED}
