"""What changes under a replan while it works: Slurm starts a job, a user cancels one.

A replan reads the batch, plans (seconds to a minute on a large batch), then acts.
Meanwhile Slurm's scheduler starts pending jobs (most often right when a job ends,
which is when a replan runs) and users cancel jobs. Reproduced on the in-memory Slurm,
which answers ``scontrol update`` of a job that no longer waits as Slurm 22.05 does
("Job is no longer pending execution for job N", "Job has already finished for job N":
checked on the testbed):

* before, the replan stopped on that answer, half applied, exit 3;
* before, a job that ended while the replan planned (a plain ``scancel``, or its own
  end) was submitted again when the replan moved it;
* before, a ``hetsched cancel`` that landed while the replan planned was undone when
  the replan moved the job, and a ``cancel --all`` in the middle of a submit missed
  the jobs not yet submitted; now the cancel waits its turn (app/batch_lock.py).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from slurm_helpers import make_testbed_plan, throughput_rows

from hetsched.app import batch_lock, space_replan
from hetsched.app.cancel import cancel_jobs
from hetsched.app.monitor import Monitor
from hetsched.app.replan import ReplanLocked, default_lock, latest_rows, replan, replan_lock
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import EXIT_LOCKED
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import CANCELLED, Store, open_store

NODES = (("v100-1", "v100", 4), ("v100-2", "v100", 4), ("t4-1", "t4", 4))


def _jobs(n: int) -> str:
    return "jobs:\n" + "".join(
        f"  - {{name: a{i}, workload: w, dataset_size: {20000 + 5000 * i}, epochs: 1, "
        f"global_batch: 64, gpu_types: [v100, t4], min_gpus: 1, max_gpus: 4, "
        f"command: [train]}}\n" for i in range(n))


def _a_node_fails(st: Store, slurm: MemorySlurm) -> None:
    """20 jobs on 12 GPUs, then v100-2 goes down: the replan reorders the queue."""
    submit(make_testbed_plan(slurm, _jobs(20)), st, slurm)
    slurm.schedule()
    Monitor(st, slurm).poll()
    slurm.node_down("v100-2")
    Monitor(st, slurm).poll()


@pytest.mark.parametrize("meanwhile", ["slurm starts it", "a user's scancel"])
def test_a_job_that_stops_waiting_as_its_dependency_is_rewritten(
        tmp_path: Path, meanwhile: str) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    hit: list[str] = []
    real = slurm.update_dependency

    def racing(job_id: str, dependency: str) -> None:
        if not hit:  # between the replan's squeue and its scontrol update
            hit.append(job_id)
            if meanwhile == "slurm starts it":
                slurm.jobs_by_id[job_id].state = "RUNNING"
            else:
                slurm.cancel([job_id])
        real(job_id, dependency)

    with open_store(tmp_path / "s.db") as st:
        _a_node_fails(st, slurm)
        slurm.update_dependency = racing  # type: ignore[method-assign]
        with replan_lock(default_lock(st)):
            r = replan(st, slurm, ThroughputTable(throughput_rows()))
        assert r.status == "replanned", r.reason
        [jid] = hit
        rewritten = [c for c in slurm.calls if c[0] == "scontrol update"
                     and c[1][1].startswith("dependency=")]
        assert len(rewritten) > 1  # the jobs after it were still brought in line
        slurm.update_dependency = real  # type: ignore[method-assign]
        Monitor(st, slurm).poll()
        [row] = [w for w in latest_rows(st).values() if w.slurm_id == jid]
        want = "RUNNING" if meanwhile == "slurm starts it" else CANCELLED
        assert row.state == want
        assert jid not in slurm.active() if want == CANCELLED else jid in slurm.active()


def _a_job_ends(st: Store, slurm: MemorySlurm) -> None:
    """Six jobs planned by HAS; the first ends, and the replan moves a5 (cancelled and
    submitted again on the GPUs it frees)."""
    jobs = "jobs:\n" + "".join(
        f"  - {{name: a{i}, workload: w, dataset_size: {20000 + 40000 * i}, epochs: 1, "
        f"global_batch: 64, gpu_types: [v100, t4], min_gpus: 1, max_gpus: 8, "
        f"command: [train]}}\n" for i in range(6))
    submit(make_testbed_plan(slurm, jobs, policy="has"), st, slurm)
    slurm.schedule()
    Monitor(st, slurm).poll()
    slurm.finish(latest_rows(st)["a0"].slurm_id or "")
    Monitor(st, slurm).poll()


def _replan_while(st: Store, slurm: MemorySlurm, monkeypatch: pytest.MonkeyPatch,
                  meanwhile: Any) -> Any:
    """A replan pass with ``meanwhile`` run in another thread as it plans (given up to
    a second to finish: a cancel that waits for the pass does not)."""
    real = space_replan.plan_jobs

    def planning(*a: Any, **k: Any) -> Any:
        t = threading.Thread(target=meanwhile)
        t.start()
        t.join(1.0)
        threads.append(t)
        return real(*a, **k)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(space_replan, "plan_jobs", planning)
    with replan_lock(default_lock(st)):
        r = replan(st, slurm, ThroughputTable(throughput_rows()))
    monkeypatch.setattr(space_replan, "plan_jobs", real)
    return r, threads


def _still_queued(slurm: MemorySlurm, job: str) -> list[str]:
    return [i for i in slurm.active() if slurm.jobs_by_id[i].name == job]


def test_a_cancel_while_a_replan_plans_waits_for_it_and_stays_final(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    said: list[str] = []
    done: list[Any] = []
    with open_store(tmp_path / "s.db") as st:
        _a_job_ends(st, slurm)

        def user() -> None:  # `hetsched cancel a5`: another process, its own connection
            with open_store(tmp_path / "s.db") as st2:
                done.append(cancel_jobs(st2, slurm, ["a5"], reason="wrong data",
                                        say=said.append))

        r, [t] = _replan_while(st, slurm, monkeypatch, user)
        assert "a5" in {n for n, _ in r.submitted}  # the pass moved it
        assert not done  # the cancel waited for the pass (before: it went first, and the
        t.join(20)  # pass submitted a5 again on its new GPUs: the cancel undone)
        assert said and said[0].startswith("waiting for a replan (pid "), said
        [res] = done
        assert [n for n, _ in res.cancelled] == ["a5"]
        Monitor(st, slurm).poll()
        assert latest_rows(st)["a5"].state == CANCELLED
        assert not _still_queued(slurm, "a5")
        with replan_lock(default_lock(st)):  # and the next replan leaves it cancelled
            again = replan(st, slurm, ThroughputTable(throughput_rows()), force=True)
        assert "a5" in again.user_cancelled
        assert "a5" not in {n for n, _ in again.submitted}


@pytest.mark.parametrize("end", ["CANCELLED", "COMPLETED"])
def test_a_job_that_ends_while_a_replan_plans_is_not_run_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, end: str) -> None:
    """A plain ``scancel`` (no lock can see it), or the job's own end, as the pass plans."""
    slurm = MemorySlurm(nodes_spec=NODES)
    with open_store(tmp_path / "s.db") as st:
        _a_job_ends(st, slurm)
        jid = latest_rows(st)["a5"].slurm_id or ""

        def meanwhile() -> None:
            if end == "CANCELLED":
                slurm.cancel([jid])
            else:
                slurm.finish(jid)

        r, _ = _replan_while(st, slurm, monkeypatch, meanwhile)
        assert "a5" not in {n for n, _ in r.submitted}  # before: submitted again
        assert [c.why for c in r.changes if c.job == "a5"] == [
            "ended while this replan planned (Slurm shows it gone): left as it is, for the "
            "monitor to record"]
        assert not _still_queued(slurm, "a5")
        Monitor(st, slurm).poll()
        assert latest_rows(st)["a5"].state == end
        with replan_lock(default_lock(st)):
            again = replan(st, slurm, ThroughputTable(throughput_rows()))
        assert "a5" in (again.user_cancelled if end == "CANCELLED" else again.done)
        assert not _still_queued(slurm, "a5")


def test_a_pending_job_scancelled_while_a_replan_plans_is_not_changed_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass would change a19 in place (scontrol update: id kept); the user scancels
    it meanwhile. Left out, said so (before: "started before it could be changed in
    place: runs where it was", of a job that no longer exists)."""
    slurm = MemorySlurm(nodes_spec=NODES)
    with open_store(tmp_path / "s.db") as st:
        _a_node_fails(st, slurm)
        jid = latest_rows(st)["a19"].slurm_id or ""
        r, _ = _replan_while(st, slurm, monkeypatch, lambda: slurm.cancel([jid]))
        assert r.status == "replanned"
        assert "a19" not in {n for n, _ in r.updated + r.submitted}
        assert len(r.updated) > 1  # the others were changed in place
        assert [c.why for c in r.changes if c.job == "a19"] == [
            "ended while this replan planned (Slurm shows it gone): left as it is, for the "
            "monitor to record"]
        Monitor(st, slurm).poll()
        assert latest_rows(st)["a19"].state == CANCELLED
        assert not _still_queued(slurm, "a19")


def test_a_cancel_that_waits_too_long_cancels_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    monkeypatch.setattr(batch_lock, "SUBMIT_WAIT_S", 0.3)
    with open_store(tmp_path / "s.db") as st:
        submit(make_testbed_plan(slurm, _jobs(2)), st, slurm)
        with replan_lock(default_lock(st)), pytest.raises(ReplanLocked) as e:
            cancel_jobs(st, slurm, None)
        assert e.value.exit_code == EXIT_LOCKED
        assert "a replan (pid " in str(e.value) and "nothing was cancelled" in str(e.value)
        assert len(slurm.active()) == 2 and slurm.count("scancel") == 0
        assert {w.state for w in latest_rows(st).values()} != {CANCELLED}


def test_a_cancel_all_in_the_middle_of_a_submit_cancels_the_whole_batch(
        tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    done: list[Any] = []
    threads: list[threading.Thread] = []

    def user() -> None:  # `hetsched cancel --all` as the third sbatch goes in
        with open_store(tmp_path / "s.db") as st2:
            done.append(cancel_jobs(st2, slurm, None))

    def third(_jid: str) -> None:
        if slurm.count("sbatch") == 3 and not threads:
            threads.append(threading.Thread(target=user))
            threads[0].start()
            threads[0].join(1.0)

    with open_store(tmp_path / "s.db") as st:
        slurm.on_submit = third
        res = submit(make_testbed_plan(slurm, _jobs(6)), st, slurm)
        assert len(res.submitted) == 6 and not done  # before: 3 cancelled, 3 went on
        threads[0].join(20)
        [out] = done
        assert len(out.cancelled) == 6 and slurm.active() == []
        assert {w.state for w in latest_rows(st).values()} == {CANCELLED}
