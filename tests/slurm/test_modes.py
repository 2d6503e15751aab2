"""app/modes.py: one adapter per sharing mode, chosen in one place (in-memory Slurm,
real plans, SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pool_slurm_helpers import pool_plan

from hetsched.app.modes import active_mode, mode_named
from hetsched.app.submit import submit
from hetsched.errors import HetschedError
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import CANCELLED, open_store

NODES = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]


def test_the_plans_mode_picks_the_adapter(tmp_path: Path) -> None:
    assert mode_named("space").name == "space" and mode_named("pool").name == "pool"
    with pytest.raises(HetschedError, match="unknown plan mode 'auto'"):
        mode_named("auto")  # a request, never a plan's mode
    with open_store(tmp_path / "s.db") as st:
        assert active_mode(st).name == "space"  # nothing submitted yet


def test_pool_plan_is_submitted_whole_and_its_jobs_dropped_one_by_one(tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="m")
    names = sorted(j.name for j in plan.jobs)
    slurm = MemorySlurm(nodes_spec=NODES)
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(HetschedError, match="submitted whole"):
            submit(plan, st, slurm, only={names[0]})  # said, not silently dropped
        res = submit(plan, st, slurm)
        assert len({jid for _, jid in res.submitted}) == 1  # one hetjob
        mode = active_mode(st)
        assert mode.name == "pool"
        one = mode.cancel(st, slurm, [names[0]], reason="test")  # dropped: the pool goes on
        assert [j for j, _ in one.dropped] == [names[0]] and slurm.count("scancel") == 0
        done = mode.cancel(st, slurm, names[1:], reason="test")  # the last live ones: all
        assert sorted(j for j, _ in one.dropped + done.cancelled) == names
        assert {s.state for s in st.submissions()} == {CANCELLED}
        assert slurm.count("scancel") == 1
