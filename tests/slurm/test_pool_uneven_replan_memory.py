"""An uneven pool plan that failed midway, replanned, on the in-memory Slurm (real plans,
files, SQLite): the user's path through submit, status, replan and status again.

The executors' part is played by their files: task records for the rounds that ran
and the checkpoint sidecars (``<job>.json``, ``rounds_done``) written at round
boundaries, as ``hetsched exec`` writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pool_slurm_helpers import UNEVEN_LAYOUT, emulated_rows, pool_plan, report_rounds, uneven_plan

from hetsched.app.pool_status import active_pool_progress
from hetsched.app.pool_submit import pool_dirs, submit_pool
from hetsched.app.replan import replan
from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import UNEVEN_COLUMNS
from hetsched.core.throughput import ThroughputTable
from hetsched.io.plan_json import plan_from_dict
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]


def write_sidecars(folder: Path, plan: Plan, done: dict[str, int]) -> None:
    """The checkpoint sidecars the executors write at a round boundary (``rounds_done``)."""
    assert plan.tasks is not None
    folder.mkdir(parents=True, exist_ok=True)
    for n, k in done.items():
        (folder / f"{n}.json").write_text(json.dumps(
            {"rounds_done": k, "rounds": plan.tasks.jobs[n].rounds}))


def test_an_uneven_pool_plan_failed_midway_goes_on_where_each_job_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = uneven_plan("ur")
    a, b = "ura", "urb"
    done = {a: 5, b: 2}  # a's rounds 3 and 4 ran 3 and 2 iterations on the A100 alone
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        pid = str(plan.plan_id)
        dirs = pool_dirs(st, pid)
        report_rounds(dirs.report_dir, plan, done, partial={a: 5})  # round 5: half of it
        write_sidecars(dirs.checkpoint_dir / pid, plan, done)
        prog = active_pool_progress(st)
        assert prog is not None
        by = {j.job: j for j in prog.jobs}
        assert (by[a].rounds_done, by[b].rounds_done) == (5, 2)

        slurm.finish(pool_id, "FAILED")  # an executor died
        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert r.status == "replanned", r.summary()
        stored = st.active_plan()
        assert stored is not None and stored["plan_id"] == r.new_plan_id
        new = plan_from_dict(stored, "stored")
        assert new.notes.resume == {
            a: {"plan_id": pid, "rounds_done": 5, "iterations_done": 20},
            b: {"plan_id": pid, "rounds_done": 2, "iterations_done": 10}}
        exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
        xn = exec_plan(new, "stored")
        total = sum(n for n, _ in UNEVEN_LAYOUT)
        for n, (k, steps, left) in {a: (5, 20, total - 20), b: (2, 10, 25)}.items():
            xj = xn.jobs[n]
            assert xj.round_step(k) == steps  # the sampler goes on at the step reached
            assert sum(xj.round_iterations(r) for r in range(k, xj.rounds)) == left
            assert (dirs.checkpoint_dir / str(new.plan_id) / f"{n}.json").exists()

        # status of the new plan counts the job's whole life, by each round's own tasks
        prog = active_pool_progress(st)
        assert prog is not None and prog.plan_id == new.plan_id
        by = {j.job: j for j in prog.jobs}
        assert (by[a].rounds_done, by[b].rounds_done) == (5, 2)
        report_rounds(pool_dirs(st, str(new.plan_id)).report_dir, new, {a: 7, b: 3})
        prog = active_pool_progress(st)
        assert prog is not None
        by = {j.job: j for j in prog.jobs}
        assert (by[a].rounds_done, by[b].rounds_done) == (7, 3)
        assert by[a].tasks == sum(1 for g in xn.gpus.values() for t in g.tasks if t.job == a)


def test_jobs_of_different_task_sizes_are_replanned_each_at_its_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Automatic task sizes differ between jobs (and the work left gets its own): the
    replanned plan starts each job at the step it reached all the same."""
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    jobs = ("jobs:\n"
            "  - {name: %(p)sa, workload: mlp, dataset_size: 16000, epochs: 1, "
            "global_batch: 16}\n"
            "  - {name: %(p)sb, workload: mlp, dataset_size: 640, epochs: 1, "
            "global_batch: 16}\n")
    plan = pool_plan(NODES, jobs, prefix="mx", task_iterations=None)
    plan.plan_id = str(plan.to_dict()["plan_id"])
    assert plan.tasks is not None
    sizes = {n: m.iterations_per_task for n, m in plan.tasks.jobs.items()}
    assert len(set(sizes.values())) == 2
    slurm = MemorySlurm(nodes_spec=NODES)
    done = {"mxa": 120, "mxb": 1}  # mxa: 400 of 1,000 iterations left
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        pid = str(plan.plan_id)
        write_sidecars(pool_dirs(st, pid).checkpoint_dir / pid, plan, done)
        slurm.finish(pool_id, "NODE_FAIL")
        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert r.status == "replanned", r.summary()
        stored = st.active_plan()
        assert stored is not None
        new = plan_from_dict(stored, "stored")
        exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
        xo, xn = exec_plan(plan), exec_plan(new, "stored")
        assert new.tasks is not None  # the work left got a smaller size: rows of their own
        assert new.tasks.jobs["mxa"].iterations_per_task < sizes["mxa"]
        assert tuple(new.tasks.columns or ()) == UNEVEN_COLUMNS
        for n, k in done.items():
            steps = k * sizes[n]
            assert new.notes.resume is not None
            assert new.notes.resume[n]["iterations_done"] == steps
            assert xn.jobs[n].round_step(k) == steps == xo.jobs[n].round_step(k)
            left = sum(xn.jobs[n].round_iterations(r) for r in range(k, xn.jobs[n].rounds))
            assert left == plan.tasks.jobs[n].iterations - steps


def test_a_pool_job_pinned_to_a_node_already_down_is_replanned_off_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node was down before the batch: no node transition, the blocked job is the event."""
    from hetsched.app.monitor import Monitor

    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    nodes = [("a100-1", "a100", 1), ("v100-1", "v100", 1), ("v100-2", "v100", 1)]
    plan = pool_plan(nodes[:2], prefix="bk")  # planned before v100-1 went down
    slurm = MemorySlurm(nodes_spec=nodes)
    slurm.node_state["v100-1"] = "down"
    with open_store(tmp_path / "s.db") as st:
        pool_id = submit_pool(plan, st, slurm, partition="gpu").slurm_id
        slurm.schedule()
        assert slurm.jobs_by_id[pool_id].state == "PENDING"
        events = Monitor(st, slurm, partition="gpu").poll().events  # one per job of the pool
        assert sorted((e.kind, e.job) for e in events) == [
            ("job-blocked", j.name) for j in sorted(plan.jobs, key=lambda j: j.name)]
        r = replan(st, slurm, ThroughputTable(emulated_rows()), partition="gpu")
        assert r.status == "replanned" and "job-blocked" in r.reason, r.summary()
        new = plan_from_dict(st.active_plan() or {}, "stored")
        assert new.tasks is not None
        assert "v100-1" not in {g.node for g in new.tasks.gpus}
        assert slurm.jobs_by_id[pool_id].state == "CANCELLED"
