"""The monitor's cost per cycle on the in-memory Slurm (the testbed test is beside it:
test_monitor_replan.py::test_one_squeue_per_cycle).

Slurm 22.05 gives a job pinned with ``--nodelist`` to a node that is only
*busy* the same reason as one whose node is down or drained
("ReqNodeNotAvail, UnavailableNodes:v100-1"), depending on which scheduler
pass looked at it last. The monitor used to run ``sinfo`` whenever it saw
that text, so a queue of pinned jobs waiting for GPUs cost two commands per
cycle, some of the time: the intermittent failure of the testbed test.
"""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import contract_plan

from hetsched.app.monitor import Monitor, busy_nodes, waits_for_unavailable_node
from hetsched.app.submit import submit
from hetsched.slurm.client import JobInfo
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = (("v100-1", "v100", 4), ("v100-2", "v100", 4), ("t4-1", "t4", 4))


def test_jobs_waiting_for_a_busy_pinned_node_cost_one_squeue(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = contract_plan("mon1", {f"m{i}": [[("v100-1", "v100", 4)]] for i in range(8)})
    with open_store(tmp_path / "s.db") as st:
        submit(plan, st, slurm)
        mon = Monitor(st, slurm)
        mon.poll()  # first cycle: squeue + the baseline sinfo
        slurm.schedule()
        waiting = [j for j in slurm.jobs() if j.state == "PENDING"]
        assert len(waiting) == 4 and all("UnavailableNodes:v100-1" in j.reason_detail
                                         for j in waiting)  # what Slurm 22.05 says
        before = slurm.count("sinfo")
        second = mon.poll()
        assert slurm.count("sinfo") == before, second  # busy, not unavailable: no sinfo
        assert sum(s == "RUNNING" for s in second.jobs.values()) == 4
        assert not second.checked_nodes


def test_a_pinned_job_whose_node_runs_nothing_makes_the_monitor_look(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = contract_plan("mon2", {"a": [[("v100-2", "v100", 4)]]})
    with open_store(tmp_path / "s.db") as st:
        mon = Monitor(st, slurm)
        mon.poll()  # baseline: every node usable
        slurm.node_state["v100-2"] = "drained"  # drained while idle: no job notices
        submit(plan, st, slurm)
        slurm.schedule()
        before = slurm.count("sinfo")
        cycle = mon.poll()
        assert slurm.count("sinfo") == before + 1 and cycle.checked_nodes
        assert [(e.kind, e.node) for e in cycle.events] == [("node-drained", "v100-2")]


def test_which_reasons_mean_a_node_is_unavailable() -> None:
    def job(state: str, nodes: str = "", reason: str = "", detail: str = "",
            req: str = "") -> JobInfo:
        return JobInfo("1", "x", state, reason=reason, nodes=nodes, reason_detail=detail,
                       required_nodes=req)

    busy = busy_nodes([job("RUNNING", "v100-[1-2]"), job("COMPLETING", "t4-1"),
                       job("PENDING", "a100-1")])
    assert busy == {"v100-1", "v100-2", "t4-1"}
    waits = waits_for_unavailable_node
    na = "ReqNodeNotAvail"
    assert not waits([job("PENDING", reason=na, detail=f"{na}, UnavailableNodes:v100-1")], busy)
    assert waits([job("PENDING", reason=na, detail=f"{na}, UnavailableNodes:a100-1")], busy)
    assert waits([job("PENDING", reason=na, detail=f"{na}, UnavailableNodes:v100-[1-3]")], busy)
    assert not waits([job("PENDING", reason=na, req="t4-1")], busy)  # 23.02: no detail
    assert waits([job("PENDING", reason=na)], busy)  # no node named: look
    assert not waits([job("PENDING", reason="Resources")], set())
