"""On the real testbed: a replan after one completion changes a pending job in place
(same Slurm id; `scontrol show job` shows the new GRES and node), and the real
`hetsched run` then starts it with the new layout."""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_helpers import make_testbed_plan, throughput_rows, use_real_hetsched, wait_for

from hetsched.app.monitor import Monitor
from hetsched.app.replan import latest_rows, replan
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

# fifo on a100:2x2, v100:2x4, t4:1x4: R1 takes the four t4, R2 the eight v100, P waits.
# The plan starts P on v100 after R2 (predicted to end first); R1 really ends first
# (its command exits at once), so the replan gives P two of the freed t4 instead.
JOBS = """jobs:
  - {{name: R1, workload: w, dataset_size: 400000, epochs: 1, global_batch: 64,
     gpu_types: [t4], min_gpus: 4, max_gpus: 4, command: ["true"]}}
  - {{name: R2, workload: w, dataset_size: 20000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 8, max_gpus: 8, command: [sleep, "600"]}}
  - {{name: P, workload: w, dataset_size: 20000, epochs: 1, global_batch: 64,
     gpu_types: [v100, t4], min_gpus: 2, max_gpus: 2,
     command: [sh, -c, 'echo "rank=$RANK of $WORLD_SIZE node=$SLURMD_NODENAME batch=$HETSCHED_LOCAL_BATCH batches=$HETSCHED_LOCAL_BATCHES" >> {out}']}}
"""


def _show(client: CliSlurmClient, jid: str) -> dict[str, str]:
    from hetsched.slurm.client import parse_scontrol_records

    res = client.runner.run(["scontrol", "show", "job", "--oneliner", jid])
    return parse_scontrol_records(res.stdout)[0]


def test_replan_changes_a_pending_job_in_place_and_it_runs_with_the_new_layout(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_real_hetsched(tmp_path, monkeypatch)  # the real `hetsched run` in the job steps
    out = tmp_path / "p.out"
    plan = make_testbed_plan(client, JOBS.format(out=out))
    assert {w.gpu_type for w in plan.job("P").segments[0].workers} == {"v100"}
    with open_store(tmp_path / "s.db") as st:
        res = submit(plan, st, client, partition="gpu")
        ids = dict(res.submitted)
        assert res.after.get("P") == ["R2"]  # P waits for R2's GPUs (--dependency)
        wait_for(lambda: _state(client, ids["R1"]) == "COMPLETED"
                 and _state(client, ids["R2"]) == "RUNNING", 60, "R1 to end, R2 to run")
        assert _state(client, ids["P"]) == "PENDING"
        was = _show(client, ids["P"])
        assert was["TresPerNode"] == "gres:gpu:2" and was["ReqNodeList"].startswith("v100-")

        r = replan(st, client, ThroughputTable(throughput_rows()), partition="gpu")
        assert "job-completed" in r.reason, r.summary()
        assert r.updated == [("P", ids["P"])], r.summary()
        assert not r.cancelled and not r.submitted, r.summary()  # nothing resubmitted
        (change,) = [c for c in r.changes if c.job == "P" and "GPUs" in c.why]
        assert "updated in place" in change.why and change.now == "t4-1:2", change
        assert latest_rows(st)["P"].slurm_id == ids["P"]  # the same Slurm job

        now = _show(client, ids["P"])  # what Slurm holds now for the pending job
        assert (now["TresPerNode"], now["ReqNodeList"], now["NumTasks"]) == \
            ("gres:gpu:2", "t4-1", "2"), now
        assert now["Comment"].startswith(f"hetsched:{r.new_plan_id}:P:")

        # the dependency on R2 was dropped in place: P starts on the freed t4 now
        wait_for(lambda: _state(client, ids["P"]) == "COMPLETED", 60, "P to run on t4-1")
        lines = sorted(out.read_text().splitlines())
        assert lines == ["rank=0 of 2 node=t4-1 batch=32 batches=32,32",
                         "rank=1 of 2 node=t4-1 batch=32 batches=32,32"], lines
        Monitor(st, client, partition="gpu").poll()
        assert latest_rows(st)["P"].state == "COMPLETED"
        assert _state(client, ids["R2"]) == "RUNNING"  # never moved


def _state(client: CliSlurmClient, jid: str) -> str:
    from hetsched.app.monitor import combined_state

    comps = [j for j in client.jobs() if j.leader == jid]
    return combined_state(comps) if comps else "GONE"


def test_a_hetjob_moves_a_later_component_to_another_type_in_place(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    """Component 1 moves from t4-1 to v100-2 (another GPU type) and component 0 grows
    from one to two GPUs on its node, through `scontrol update`; the step then runs
    2 + 1 ranks where the new plan says (the session's stand-in `hetsched run`)."""
    from slurm_helpers import contract_plan

    from hetsched.app.replan_inplace import layout_of, update_in_place
    from hetsched.app.submit import files_dir
    from hetsched.io.layout import read_layout

    old = contract_plan("hip1", {
        "a-blk": [[("t4-1", "t4", 8)] * 4],  # holds t4-1, so h waits
        "h": [[("v100-1", "v100", 8), ("t4-1", "t4", 8)]]})
    new = contract_plan("hip2", {"h": [[("v100-1", "v100", 4)] * 2 + [("v100-2", "v100", 8)]]})
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(old, st, client, partition="gpu").submitted)
        wait_for(lambda: _state(client, ids["a-blk"]) == "RUNNING", 20, "the blocker to run")
        assert _state(client, ids["h"]) == "PENDING"
        st.add_plan(new.to_dict(), source="replan")
        row = latest_rows(st)["h"]
        res = update_in_place(st, client, new, [(row, new.job("h"))])
        assert res.updated == [("h", ids["h"])], res
        comps = sorted((j for j in client.jobs() if j.leader == ids["h"]),
                       key=lambda j: j.het_offset or 0)
        shown = [_show(client, c.job_id) for c in comps]
        assert [(r["ReqNodeList"], r["TresPerNode"], r["NumTasks"]) for r in shown] == [
            ("v100-1", "gres:gpu:2", "2"), ("v100-2", "gres:gpu:1", "1")], shown
        assert read_layout(layout_of(st, row)).groups == (
            ("v100", "v100-1", (4, 4)), ("v100", "v100-2", (8,)))
        wait_for(lambda: _state(client, ids["h"]) == "RUNNING", 30, "h to start")
        log = files_dir(st) / "logs" / f"h-{ids['h']}.out"
        wait_for(lambda: log.exists() and log.read_text().count("rank=") == 3, 20,
                 "three ranks to start")
        ranks = sorted(x.split("rank=")[1] for x in log.read_text().splitlines() if "rank=" in x)
        assert ranks == ["0", "1", "2"]
        nodes = {j.het_offset: j.nodes for j in client.jobs() if j.leader == ids["h"]}
        assert nodes == {0: "v100-1", 1: "v100-2"}
