"""Partition MaxTime on the in-memory Slurm: the limit each script gets, and refusals.

The real-Slurm side (a pending job kept for ever, the capped job starting) is
tests/slurm/test_max_time_tb.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pool_slurm_helpers import pool_plan

from hetsched.app.pool_submit import submit_pool
from hetsched.app.submission import Site
from hetsched.core.sbatch import SbatchOptions
from hetsched.errors import InputError
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]


def test_site_caps_hetscheds_own_limit_and_refuses_the_users(monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_TIME_MARGIN", "1.5")
    monkeypatch.setenv("HETSCHED_TIME_PAD", "600")
    monkeypatch.setenv("HETSCHED_SIGNAL_S", "300")
    site = Site("gpu", max_time_min=60)
    # 1 h predicted: 1.5 h + 10 min wanted, 60 min granted, the warning at most half of it
    assert site.limit("a", SbatchOptions(), 3600.0) == (60, 300)
    assert site.limit("b", SbatchOptions(), 600.0) == (25, 300)  # under MaxTime: its own
    assert site.limit("c", SbatchOptions(time="1:00:00"), 1e6) == (60, 300)
    assert site.capped == [("a", 100)]
    note = site.capped_note()
    assert note is not None and "1 of the jobs" in note and "a 100 min" in note
    with pytest.raises(InputError, match="61 is above partition gpu's MaxTime of 60 min"):
        site.limit("d", SbatchOptions(time="61"), 10.0)
    unlimited = Site("gpu")
    assert unlimited.limit("e", SbatchOptions(), 1e6)[0] > 10_000 and not unlimited.capped


def test_a_pool_plan_longer_than_max_time_is_refused_before_sbatch(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    plan = pool_plan(NODES, prefix="mt", task_iterations=5)
    slurm = MemorySlurm(nodes_spec=NODES, max_time={"gpu": 1})
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(InputError, match="above partition gpu's MaxTime of 1 min"):
            submit_pool(plan, st, slurm, partition="gpu")
        assert slurm.count("sbatch") == 0 and not st.submissions()
        slurm.max_time["gpu"] = 10_000
        assert submit_pool(plan, st, slurm, partition="gpu").slurm_id


def test_submit_says_where_a_node_cannot_give_what_the_plan_runs_there_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cores per node (cpus_per_gpu x GPUs of the jobs on it at once) and whole-node
    partitions (OverSubscribe=EXCLUSIVE): the jobs still run, some later: one line each."""
    import logging

    from slurm_helpers import contract_plan

    from hetsched.app.submit import submit

    # a CLI test before this one may have set the logger not to propagate (its handler)
    monkeypatch.setattr(logging.getLogger("hetsched"), "propagate", True)
    # v100-1: 4 GPUs, 8 cores (MemorySlurm gives 2 a GPU); two one-GPU jobs at once
    plan = contract_plan("fit1", {"f1": [[("v100-1", "v100", 8)]],
                                  "f2": [[("v100-1", "v100", 8)]],
                                  "f3": [[("t4-1", "t4", 8)]]})
    slurm = MemorySlurm(exclusive={"gpu"})
    with caplog.at_level(logging.WARNING, logger="hetsched"), \
            open_store(tmp_path / "s.db") as st:
        submit(plan, st, slurm, partition="gpu", sbatch=SbatchOptions(cpus_per_gpu=5))
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "node v100-1 has 8 CPU cores; the plan runs f1, f2 there at once, which ask for 10 "
        "(cpus_per_gpu per GPU): some will wait for cores",
        "partition gpu gives whole nodes (OverSubscribe=EXCLUSIVE): the plan runs f1, f2 on "
        "node v100-1 at once; Slurm will run them one after another"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hetsched"), \
            open_store(tmp_path / "s2.db") as st:
        submit(plan, st, MemorySlurm(), partition="gpu", sbatch=SbatchOptions(cpus_per_gpu=4))
    assert not caplog.records  # 8 cores for 2 x 4, nodes shared: nothing to say


def test_submit_says_which_jobs_the_plan_puts_on_a_node_that_is_down_now(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan made before a node was drained: its jobs there wait; one line says so."""
    import logging

    from slurm_helpers import contract_plan

    from hetsched.app.submit import submit

    monkeypatch.setattr(logging.getLogger("hetsched"), "propagate", True)
    plan = contract_plan("dn", {"d1": [[("v100-1", "v100", 8)]],
                                "d2": [[("v100-1", "v100", 8), ("t4-1", "t4", 8)]],
                                "d3": [[("t4-1", "t4", 8)]]})
    slurm = MemorySlurm()
    slurm.node_state["v100-1"] = "drained"
    with caplog.at_level(logging.WARNING, logger="hetsched"), \
            open_store(tmp_path / "s.db") as st:
        assert len(submit(plan, st, slurm, partition="gpu").submitted) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "the plan places jobs on nodes Slurm shows unavailable now: d1, d2 on v100-1 "
        "(drained); they wait until the node returns: `hetsched replan` moves them (or plan "
        "again)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hetsched"), \
            open_store(tmp_path / "s2.db") as st:
        submit(plan, st, MemorySlurm(), partition="gpu", pin_nodes=False)
        submit(contract_plan("up", {"u": [[("t4-1", "t4", 8)]]}), st, slurm, partition="gpu",
               allow_active_elsewhere=True)
    assert not caplog.records  # not pinned; or not on the drained node


def test_submit_says_when_a_pool_job_is_pinned_to_a_node_that_is_down_now(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    monkeypatch.setattr(logging.getLogger("hetsched"), "propagate", True)
    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    plan = pool_plan(NODES, prefix="dn", task_iterations=5)
    slurm = MemorySlurm(nodes_spec=NODES)
    slurm.node_state["v100-1"] = "down"
    with caplog.at_level(logging.WARNING, logger="hetsched"), \
            open_store(tmp_path / "s.db") as st:
        assert submit_pool(plan, st, slurm, partition="gpu").slurm_id
    assert [r.getMessage() for r in caplog.records] == [
        "the pool job runs on nodes Slurm shows unavailable now: v100-1 (down); it waits "
        "until they return: `hetsched replan` moves it (or plan again)"]
