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
        assert [(e.kind, e.node or e.job) for e in cycle.events] == [
            ("node-drained", "v100-2"), ("job-blocked", "a")]


def test_a_job_placed_on_a_node_already_down_is_a_reset_event_once(tmp_path: Path) -> None:
    """Down before the monitor's first look (or before the batch): no node transition to
    see, so the waiting job itself is the event, and replan moves it."""
    from slurm_helpers import make_testbed_plan, throughput_rows

    from hetsched.app.replan import replan
    from hetsched.core.throughput import ThroughputTable

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, """jobs:
  - {name: a, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 4, max_gpus: 4, command: [train]}
""")
    (node,) = {w.node for w in plan.job("a").segments[0].workers}
    slurm.node_state[node] = "drained"  # after planning, before the monitor's first look
    with open_store(tmp_path / "s.db") as st:
        sid = dict(submit(plan, st, slurm).submitted)["a"]
        slurm.schedule()
        mon = Monitor(st, slurm)
        first = mon.poll()  # the baseline: the node was drained all along
        assert [(e.kind, e.job, e.detail) for e in first.events] == [
            ("job-blocked", "a", f"waits for {node} (drained)")]
        assert not mon.poll().events  # once per Slurm job
        r = replan(st, slurm, ThroughputTable(throughput_rows()))
        assert r.reason == "job-blocked" and r.updated == [("a", sid)], r.summary()
        new = sid  # moved in place (scontrol update): the same Slurm job
        slurm.schedule()
        assert slurm.jobs_by_id[new].state == "RUNNING"
        assert node not in {c.running_on for c in slurm.jobs_by_id[new].comps}


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


def test_a_requeue_no_poll_saw_is_an_event_once(tmp_path: Path) -> None:
    """Slurm's restart count tells what the states cannot: the job was requeued (a node
    failed) before any poll saw it run, or was requeued and ran again between polls."""
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = contract_plan("rq", {"a": [[("v100-1", "v100", 4)]], "b": [[("t4-1", "t4", 4)]]})
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        slurm.schedule()  # both run; no poll sees it
        slurm.node_down("v100-1")  # a is requeued: PENDING again, as the state file has it
        mon = Monitor(st, slurm)
        first = mon.poll()
        assert sorted((e.kind, e.job) for e in first.events) == [
            ("job-requeued", "a"), ("job-started", "b")]
        assert first.checked_nodes
        assert not mon.poll().events  # once
        slurm.requeue([ids["b"]])  # requeued, and running again before the next poll
        slurm.schedule()
        assert slurm.jobs_by_id[ids["b"]].state == "RUNNING"
        third = mon.poll()  # and a, pending on its down node now (its hold over), is blocked
        assert sorted((e.kind, e.job) for e in third.events) == [
            ("job-blocked", "a"), ("job-requeued", "b")]
        assert "restart 1" in next(e.detail for e in third.events if e.job == "b")
        assert not mon.poll().events
