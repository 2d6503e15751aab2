"""After a failure and the replan that follows it, the plan's order holds in Slurm.

``afterany`` lets the next job of the plan start on the GPUs a failed job
freed; the replan then resubmits the failed job. It must wait (a dependency)
for the job that now runs on its GPUs, and the jobs the plan put after it
must keep waiting for it: no pending job is left to Slurm's Resources/
Priority race. In-memory Slurm (fast); the real testbed runs the same
dependency commands in test_order_requeue.py.
"""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import make_testbed_plan, throughput_rows

from hetsched.app.monitor import Monitor
from hetsched.app.order import waits_for
from hetsched.app.replan import latest_rows, replan
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

JOBS = "jobs:\n" + "".join(
    f"  - {{name: {n}, workload: w, dataset_size: {ds}, epochs: 1, global_batch: 64,\n"
    f"     gpu_types: [v100], min_gpus: 4, max_gpus: 4, command: [train]}}\n"
    for n, ds in (("A", 100000), ("B", 200000), ("C", 50000)))


def test_a_failed_job_resubmitted_waits_for_what_runs_on_its_gpus(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=(("v100-1", "v100", 4),))
    plan = make_testbed_plan(slurm, JOBS)
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        order = sorted(ids, key=lambda n: plan.job(n).segments[0].start_s)
        first, second, third = order
        slurm.schedule()
        Monitor(st, slurm).poll()
        slurm.finish(ids[first], "FAILED", "NonZeroExitCode")
        slurm.schedule()  # afterany: the plan's next job takes the freed GPUs
        assert slurm.jobs_by_id[ids[second]].state == "RUNNING"
        r = replan(st, slurm, ThroughputTable(throughput_rows()))
        again = dict(r.submitted)[first]
        slurm.schedule()
        jobs = slurm.jobs_by_id
        # the resubmitted job waits for the one on its GPUs, not for Resources
        assert jobs[again].state == "PENDING" and jobs[again].reason == "Dependency"
        assert ids[second] in jobs[again].after
        # the job the plan put last still waits, now for both (the order stays)
        assert set(jobs[ids[third]].after) >= {ids[second], again}
        pending = [j for j in jobs.values() if j.state == "PENDING"]
        assert all(j.reason == "Dependency" for j in pending), [(j.name, j.reason)
                                                                 for j in pending]
        # and they run in the plan's order from there
        slurm.finish(ids[second])
        assert slurm.schedule() == [again]
        slurm.finish(again)
        assert slurm.schedule() == [ids[third]]
        assert latest_rows(st)[first].slurm_id == again


def test_waits_for_adds_what_runs_now_and_keeps_the_order_behind_it() -> None:
    from slurm_helpers import contract_plan

    # plan: X on GPU 0 then Y on GPU 0 then Z on GPU 0; W on GPU 1
    plan = contract_plan("wf", {"X": [[("n", "v100", 2)]], "Y": [[("n", "v100", 2)]],
                                "Z": [[("n", "v100", 2)]], "W": [[("n", "v100", 2)]]})
    d = plan.to_dict()
    for j in d["jobs"]:
        t = {"X": 0, "Y": 10, "Z": 20, "W": 0}[j["name"]]
        j["start_s"] = j["segments"][0]["start_s"] = float(t)
        j["end_s"] = j["segments"][0]["end_s"] = float(t + 10)
        for w in j["segments"][0]["workers"]:
            w["gpu"] = 1 if j["name"] == "W" else 0
    from hetsched.io.plan_json import plan_from_dict

    p = plan_from_dict(d, "test")
    assert waits_for(p, {}) == {"Y": ["X"], "Z": ["Y"]}
    # Y already runs (it started early); W runs on GPU 0 where the plan puts X
    got = waits_for(p, {"Y": [{"node": "n", "gpu": 0}], "W": [{"node": "n", "gpu": 0}]})
    assert got == {"X": ["W", "Y"], "Z": ["W", "X", "Y"]}
