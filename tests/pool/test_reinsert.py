"""Re-placing a job into the gaps other jobs leave: a job that waits while a GPU idles
starts on it; nothing else moves; the plan only improves and stays valid."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from pool_helpers import instances

from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.planner import plan_problem
from hetsched.planning.pool import reinsert
from hetsched.planning.pool.backfill import left_shift
from hetsched.planning.pool.evaluator import TaskSchedule, evaluate
from hetsched.planning.pool.from_space import space_tasks
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.reinsert import reinsert_jobs


def _pinned() -> tuple[PoolProblem, TaskSchedule]:
    """Two jobs pinned to two GPUs each on three: the space plan runs one, the other
    waits, and the third GPU idles meanwhile."""
    rows = [ProfileRow(w, "v100", b, 0.01 + 0.001 * b, 0.001) for w in ("wa", "wb")
            for b in (8, 64)]
    jobs = [Job(name=n, workload=w, dataset_size=64 * it, epochs=1, global_batch=64,
                requested_gpus=2, min_gpus=2, max_gpus=2)
            for n, w, it in (("a", "wa", 2000), ("b", "wb", 1000))]
    p = PlanningProblem(jobs, Cluster(nodes=(Node("v100-1", "v100", 3),)),
                        ThroughputTable(rows, "<pinned>"))
    space = plan_problem(p, "auto", restart_cost_s=0.0)
    pp = PoolProblem(p)
    got = space_tasks(pp, space)
    assert got is not None
    return pp, got[0]


def _rows(s: TaskSchedule) -> set[tuple[int, int, int, int, int]]:
    assert s.batch is not None and s.iters is not None
    return set(zip(*(np.asarray(x).tolist() for x in (s.job, s.rnd, s.task, s.batch, s.iters)),
                   strict=True))


def test_a_waiting_job_starts_on_the_idle_gpu() -> None:
    pp, s = _pinned()
    ev = evaluate(pp, s)
    first = np.full(pp.S, np.inf)
    np.minimum.at(first, np.asarray(s.job), np.asarray(s.start))
    late = int(np.argmax(first))  # the job the space plan makes wait
    assert first[late] > 1.0
    out = reinsert_jobs(pp, s)
    assert out.accepted >= 1
    assert out.objective < 0.9 * ev.objective
    new = out.schedule
    other = np.asarray(s.job) != late
    # the other job's tasks did not move, and every task kept its batch and iterations
    assert (np.asarray(new.start)[other] == np.asarray(s.start)[other]).all()
    assert (np.asarray(new.gpu)[other] == np.asarray(s.gpu)[other]).all()
    assert _rows(new) == _rows(s)
    mine = np.asarray(new.job) == late
    assert float(np.asarray(new.start)[mine].min()) == pytest.approx(0.0)  # at its arrival
    assert evaluate(pp, new).objective == pytest.approx(out.objective)


def test_the_work_is_counted_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    pp, s = _pinned()
    a, b = reinsert_jobs(pp, s), reinsert_jobs(pp, s)
    assert a.objective == b.objective and a.work == b.work > 0
    assert (np.asarray(a.schedule.start) == np.asarray(b.schedule.start)).all()
    monkeypatch.setattr(reinsert, "MAX_WORK", 0)
    none = reinsert_jobs(pp, s)
    assert none.schedule is s and none.tries == 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=instances())
def test_it_only_improves_and_stays_valid(p: PlanningProblem) -> None:
    space = plan_problem(p, "auto")
    pp = PoolProblem(p)
    got = space_tasks(pp, space)
    assert got is not None
    s = left_shift(pp, got[0])
    before = evaluate(pp, s).objective
    out = reinsert_jobs(pp, s)
    assert out.objective <= before
    assert evaluate(pp, out.schedule).objective == pytest.approx(out.objective)
    assert _rows(out.schedule) == _rows(s)
