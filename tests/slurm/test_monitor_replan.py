"""Monitoring and replanning on the real testbed, with injected faults (a node down mid-run,
slurmctld restarted, two replans at once, a node drained and back)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, invoke, make_testbed_plan, throughput_rows, wait_for

from hetsched.app.monitor import Event, Monitor, watch
from hetsched.app.replan import EXIT_LOCKED, ReplanLocked, default_lock, replan, replan_lock
from hetsched.app.submit import submit
from hetsched.cli import replan as cli_replan
from hetsched.cli import slurm as cli_slurm
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

TWO_JOBS = """jobs:
  - {name: A, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 2, max_gpus: 2, command: [train]}
  - {name: B, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [t4], min_gpus: 2, max_gpus: 2, command: [train]}
"""


def _table() -> ThroughputTable:
    return ThroughputTable(throughput_rows())


def _running(client: CliSlurmClient, ids: list[str]) -> bool:
    states = {j.leader: j.state for j in client.jobs()}
    return all(states.get(i) == "RUNNING" for i in ids)


def test_one_squeue_per_cycle(testbed: Testbed, client: CliSlurmClient, clean_queue: None,
                              tmp_path: Path) -> None:
    plan = contract_plan("mon1", {f"m{i}": [[("v100-1", "v100", 4)]] for i in range(8)})
    with open_store(tmp_path / "s.db") as st:
        submit(plan, st, client, partition="gpu")
        mon = Monitor(st, client, partition="gpu")
        first = mon.poll()
        assert first.checked_nodes and first.commands == 2, first  # squeue + baseline sinfo
        wait_for(lambda: sum(j.state == "RUNNING" for j in client.jobs()
                             if j.comment.startswith("hetsched:mon1:")) == 4, 20,
                 "four jobs to run (4 v100 GPUs)")
        # Slurm 22.05 says "ReqNodeNotAvail, UnavailableNodes:v100-1" for a job pinned to
        # a node that is only busy, some of the time (which scheduler pass looked last):
        # that made the monitor run sinfo on some runs (test_monitor_memory.py). Wait for
        # it so this test sees that case every time.
        wait_for(lambda: any("UnavailableNodes:v100-1" in j.reason_detail
                             for j in client.jobs() if j.state == "PENDING"
                             and j.comment.startswith("hetsched:mon1:")), 20,
                 "Slurm to name the busy node as unavailable")
        second = mon.poll()
        assert second.commands == 1 and not second.checked_nodes, second
        assert sum(1 for s in second.jobs.values() if s == "RUNNING") == 4, second
        assert sum(1 for s in second.jobs.values() if s == "PENDING") == 4, second
        assert {e.kind for e in second.events} <= {"job-started"}, second


def test_node_down_mid_run_replans_only_the_affected_job(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    plan = make_testbed_plan(client, TWO_JOBS)
    with open_store(tmp_path / "s.db") as st:
        res = submit(plan, st, client, partition="gpu")
        ids = dict(res.submitted)
        wait_for(lambda: _running(client, list(ids.values())), 20, "A and B to run")
        mon = Monitor(st, client, partition="gpu")
        mon.poll()  # baseline: both running, nodes recorded
        a_node = plan.job("A").segments[0].workers[0].node
        testbed.stop_node(a_node)  # keep it down (ReturnToService=2 would revive it)
        client.runner.run(["scontrol", "update", f"nodename={a_node}", "state=down",
                           "reason=hetsched-test"])
        r = replan(st, client, _table(), partition="gpu")
        assert r.status == "replanned", r.summary()
        assert "job-requeued" in r.reason or "job-failed" in r.reason
        if "job-requeued" in r.reason:  # --requeue: pending again, moved in place (same id)
            assert r.updated == [("A", ids["A"])] and not r.submitted and not r.cancelled
            new_a = ids["A"]
        else:  # ended (NODE_FAIL): a new hetjob
            assert [j for j, _ in r.submitted] == ["A"]
            assert r.cancelled == [("A", ids["A"])]
            new_a = dict(r.submitted)["A"]
        assert "B" in r.kept
        wait_for(lambda: _running(client, [new_a, ids["B"]]), 20,
                 f"new A to run ({[(j.state, j.reason, j.reason_detail, j.required_nodes) for j in client.jobs() if j.leader == new_a]}; {r.summary()}; {r.changes})")
        nodes = {j.leader: j.nodes for j in client.jobs() if j.state == "RUNNING"}
        assert a_node not in nodes[new_a]
        assert getattr(st.submission(r.new_plan_id or "", "A", 0), "slurm_id", "") == new_a
        # B was not disturbed: same Slurm job, still running
        assert {j.leader: j.state for j in client.jobs()}[ids["B"]] == "RUNNING"
        # idempotent and quiet: nothing new happened
        again = replan(st, client, _table(), partition="gpu")
        assert again.status == "unchanged" and not again.changed
        assert [e for e in st.events(unhandled_only=True)] == []


def test_watch_survives_slurmctld_restart(testbed: Testbed, client: CliSlurmClient,
                                          clean_queue: None, tmp_path: Path) -> None:
    plan = contract_plan("wr1", {"w1": [[("t4-1", "t4", 4)]]})
    with open_store(tmp_path / "s.db") as st:
        jid = dict(submit(plan, st, client, partition="gpu").submitted)["w1"]
        wait_for(lambda: _running(client, [jid]), 20, "job to run")
    waits: list[str] = []
    seen_after: list[float] = []
    restarted = threading.Event()

    def run_watch() -> None:
        with open_store(tmp_path / "s.db") as st2:
            mon = Monitor(st2, CliSlurmClient(Runner(env=testbed.env(), retries=0,
                                                     timeout_s=20)), partition="gpu")

            def until(cycle: object) -> bool:
                if restarted.is_set():
                    seen_after.append(time.monotonic())
                return bool(seen_after)

            watch(mon, interval_s=0.3, max_interval_s=1.0, until=until,
                  on_wait=waits.append)

    t = threading.Thread(target=run_watch, daemon=True)
    t.start()
    time.sleep(1.0)
    testbed.stop_controller()
    # keep it down until watch has seen a failed poll (squeue itself retries ~10 s)
    wait_for(lambda: waits, 40, "watch to notice slurmctld is down", every_s=0.5)
    testbed.start_controller()
    restarted.set()
    t.join(timeout=90)
    assert not t.is_alive(), "watch did not resume after slurmctld came back"
    assert waits and "Slurm did not answer" in waits[0]
    assert seen_after
    # the job survived the restart
    assert {j.leader: j.state for j in client.jobs()}.get(jid) == "RUNNING"


def test_two_replans_at_once(testbed: Testbed, tmp_path: Path) -> None:
    state = tmp_path / "s.db"
    with open_store(state) as st:
        lock = default_lock(st)
    # another process holds the lock (a slow replan)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom hetsched.app.replan import replan_lock\n"
         "with replan_lock(sys.argv[1]):\n    print('locked', flush=True)\n"
         "    time.sleep(30)\n", str(lock)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        code, out = invoke(cli_replan.replan_cmd, ["--state", str(state), "--wait", "0.5"])
        assert code == EXIT_LOCKED and out == ""  # exits cleanly and quietly
        assert 0.4 < time.monotonic() - t0 < 10
        with pytest.raises(ReplanLocked, match=f"pid {holder.pid}"):
            with replan_lock(lock):
                pass
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the dead holder's lock: the next run gets it at once
    with replan_lock(lock):
        pass


def test_completion_and_spool_events(testbed: Testbed, client: CliSlurmClient,
                                     clean_queue: None, tmp_path: Path) -> None:
    os.environ["HETSCHED_TEST_SLEEP"] = "1"  # the stand-in job step ends after 1 s
    try:
        plan = make_testbed_plan(client, TWO_JOBS)
        with open_store(tmp_path / "s.db") as st:
            ids = dict(submit(plan, st, client, partition="gpu").submitted)
            mon = Monitor(st, client, partition="gpu")
            mon.poll()
            wait_for(lambda: all(s == "COMPLETED" for s in mon.poll().jobs.values())
                     or not mon.live(), 30, "both jobs to complete")
            kinds = [e["kind"] for e in st.events()]
            assert kinds.count("job-completed") == 2
            spool = tmp_path / "spool"
            spool.mkdir()
            (spool / "new.yaml").write_text(
                "jobs:\n  - {name: C, workload: w, dataset_size: 20000, epochs: 1, "
                "global_batch: 32, gpu_types: [a100], min_gpus: 1, max_gpus: 1}\n")
            r = replan(st, client, _table(), partition="gpu", spool=spool)
            assert r.status == "replanned", r.summary()
            assert [j for j, _ in r.submitted] == ["C"]
            assert sorted(r.done) == ["A", "B"]
            assert (spool / "done" / "new.yaml").exists()
            assert ids["A"] not in dict(r.submitted).values()
    finally:
        os.environ.pop("HETSCHED_TEST_SLEEP", None)


def test_status_and_quiet_replan_cli(testbed: Testbed, client: CliSlurmClient,
                                     clean_queue: None, tmp_path: Path) -> None:
    state = str(tmp_path / "s.db")
    plan = contract_plan("cli1", {"k1": [[("t4-1", "t4", 4)]]})
    with open_store(state) as st:
        submit(plan, st, client, partition="gpu")
    code, out = invoke(cli_slurm.status_cmd, ["--state", state, "--json"])
    assert code == 0 and '"k1"' in out and '"commands"' in out
    code, out = invoke(cli_slurm.status_cmd, ["--state", state])
    assert code == 0 and "k1" in out
    tp = tmp_path / "tp.csv"
    tp.write_text("workload,gpu_type,local_batch,step_time_s\n"
                  + "".join(f"{r.workload},{r.gpu_type},{r.local_batch},{r.step_time_s}\n"
                            for r in throughput_rows()))
    code, out = invoke(cli_replan.replan_cmd, ["--state", state, "--throughputs", str(tp)])
    assert (code, out) == (0, "")  # nothing happened: quiet
    assert "nothing to do" in (Path(state + ".files") / "replan.log").read_text()
    code, out = invoke(cli_slurm.watch_cmd, ["--state", state, "--cycles", "2",
                                             "--interval", "0.1"])
    assert code == 0


def test_node_drained_and_back_events(testbed: Testbed, client: CliSlurmClient,
                                      clean_queue: None, tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as st:
        mon = Monitor(st, client, partition="gpu", node_every=1)
        assert mon.poll().events == []  # baseline
        client.runner.run(["scontrol", "update", "nodename=a100-2", "state=drain",
                           "reason=hetsched-test"])
        drained = mon.poll().events
        assert [(e.kind, e.node) for e in drained] == [("node-drained", "a100-2")]
        client.runner.run(["scontrol", "update", "nodename=a100-2", "state=resume"])
        # right after resume the node is briefly NOT_RESPONDING until pinged
        ev: list[Event] = []

        def back() -> bool:
            ev.extend(mon.poll().events)
            return bool(ev)

        wait_for(back, 15, "node-back event")
        assert [(e.kind, e.node) for e in ev] == [("node-back", "a100-2")]
        assert "2 a100 GPUs" in ev[0].detail
        assert {e["kind"] for e in st.events(unhandled_only=True)} == {"node-drained",
                                                                       "node-back"}
