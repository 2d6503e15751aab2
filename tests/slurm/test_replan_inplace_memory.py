"""Pending jobs changed in place (app/replan_inplace.py) on the in-memory Slurm, which
keeps Slurm 22.05's limits (checked on the testbed: tests/slurm/test_replan_inplace_tb.py)."""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import contract_plan

from hetsched.app.monitor import Monitor
from hetsched.app.replan import latest_rows
from hetsched.app.replan_inplace import component_order, layout_of, update_in_place
from hetsched.app.submit import submit
from hetsched.io.layout import read_layout
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import SUPERSEDED, open_store

NODES = (("a100-1", "a100", 2), ("v100-1", "v100", 4), ("v100-2", "v100", 4),
         ("t4-1", "t4", 4))


def _w(node: str, t: str, b: int, n: int = 1) -> list[tuple[str, str, int]]:
    return [(node, t, b)] * n


def test_component_order_follows_what_slurm_allows() -> None:
    def ws(*groups: tuple[str, str, int]) -> list[dict]:
        return [{"node": n, "gpu_type": t, "gpu": 0, "local_batch": 8}
                for n, t, k in groups for _ in range(k)]

    # one component: anything goes (untyped GRES + node list)
    assert component_order(ws(("t4-1", "t4", 1)), ws(("v100-2", "v100", 3))) == ([0], "")
    # a hetjob keeps its first component's node; groups on a kept node keep their slot
    assert component_order(ws(("v100-1", "v100", 2), ("t4-1", "t4", 1)),
                           ws(("v100-2", "v100", 1), ("v100-1", "v100", 3))) == ([1, 0], "")
    order, why = component_order(ws(("v100-1", "v100", 2), ("t4-1", "t4", 1)),
                                 ws(("v100-2", "v100", 2), ("t4-1", "t4", 1)))
    assert order is None and "first component would leave v100-1" in why
    order, why = component_order(ws(("t4-1", "t4", 1)),
                                 ws(("v100-1", "v100", 1), ("t4-1", "t4", 1)))
    assert order is None and "1 -> 2 hetjob components" in why


def test_pending_jobs_change_in_place_and_keep_their_ids(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    old = contract_plan("ip1", {
        "a": [_w("v100-1", "v100", 8, 4)],
        "p": [_w("v100-1", "v100", 8)],  # waits: v100-1 is full
        "h": [_w("v100-1", "v100", 8) + _w("t4-1", "t4", 8)],
        "h2": [_w("v100-1", "v100", 8) + _w("t4-1", "t4", 8)],
    })
    new = contract_plan("ip2", {
        "a": [_w("v100-1", "v100", 8, 4)],
        "p": [_w("t4-1", "t4", 4, 2)],  # another type, another count
        "h": [_w("v100-2", "v100", 8) + _w("v100-1", "v100", 4, 2)],  # t4-1 -> v100-2
        "h2": [_w("v100-2", "v100", 8) + _w("t4-1", "t4", 8)],  # its first would move
    })
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(old, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()
        rows = latest_rows(st)
        assert rows["p"].state == "PENDING" and rows["h"].state == "PENDING"
        st.add_plan(new.to_dict(), source="replan")
        res = update_in_place(st, slurm, new, [(rows[n], new.job(n)) for n in ("p", "h", "h2")])
        assert res.updated == [("p", ids["p"]), ("h", ids["h"])]
        assert "first component would leave v100-1" in res.refused["h2"]
        assert slurm.count("sbatch") == 4 and slurm.count("scancel") == 0
        p = slurm.jobs_by_id[ids["p"]]
        assert [(c.node, c.gpu_type, c.gpus) for c in p.comps] == [("t4-1", "t4", 2)]
        h = slurm.jobs_by_id[ids["h"]]  # component 0 stays on v100-1 (now 2 GPUs)
        assert [(c.node, c.gpu_type, c.gpus) for c in h.comps] == [
            ("v100-1", "v100", 2), ("v100-2", "v100", 1)]
        assert h.comment == "hetsched:ip2:h:0"
        # the layout the job's script names now says the new plan, in Slurm's order
        lay = read_layout(layout_of(st, rows["h"]))
        assert lay.plan_id == "ip2" and lay.plan.endswith("plans/ip2.json")
        assert lay.groups == (("v100", "v100-1", (4, 4)), ("v100", "v100-2", (8,)))
        assert Path(lay.plan).exists()
        after = latest_rows(st)
        assert (after["p"].plan_id, after["p"].slurm_id) == ("ip2", ids["p"])
        assert after["h2"].plan_id == "ip1"  # refused: left for replan to resubmit
        assert {s.state for s in st.submissions("ip1") if s.job in ("p", "h")} == {SUPERSEDED}
        # the updated jobs run where the new plan says once the GPUs free up
        slurm.finish(ids["a"])
        slurm.schedule()
        assert [c.running_on for c in p.comps] == ["t4-1"]
        assert [c.running_on for c in h.comps] == ["v100-1", "v100-2"]


def test_a_job_on_the_partitions_cores_per_gpu_keeps_them_per_gpu(tmp_path: Path) -> None:
    """No --cpus-per-task: Slurm gives DefCpuPerGPU cores per GPU at submission, but an
    update that sets NumCPUs is taken as it is (testbed, 22.05: a 2 -> 3 GPU update with
    NumCPUs=3 ran on 4 cores, not 6). So the update counts the job's cores per GPU."""
    slurm = MemorySlurm(nodes_spec=NODES, def_cpu_per_gpu=2)
    old = contract_plan("dc1", {"a": [_w("v100-1", "v100", 8, 4)],
                                "p": [_w("v100-1", "v100", 8)]})  # waits: v100-1 is full
    new = contract_plan("dc2", {"a": [_w("v100-1", "v100", 8, 4)],
                                "p": [_w("t4-1", "t4", 4, 3)]})
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(old, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()
        st.add_plan(new.to_dict(), source="replan")
        res = update_in_place(st, slurm, new, [(latest_rows(st)["p"], new.job("p"))])
        assert res.updated == [("p", ids["p"])]
        [(_, fields)] = [c for c in slurm.calls if c[0] == "scontrol update"
                         and any(f.startswith("NumCPUs=") for f in c[1])]
        assert "NumCPUs=6" in fields and "Gres=gpu:3" in fields, fields


def test_a_job_that_started_meanwhile_is_left_as_it_runs(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    old = contract_plan("st1", {"q": [_w("v100-2", "v100", 8)]})
    new = contract_plan("st2", {"q": [_w("t4-1", "t4", 8)]})
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(old, st, slurm).submitted)
        row = latest_rows(st)["q"]  # seen pending ...
        slurm.schedule()  # ... and started before the replan reached it
        res = update_in_place(st, slurm, new, [(row, new.job("q"))])
        assert res.started == ["q"] and not res.updated
        assert slurm.jobs_by_id[ids["q"]].comps[0].running_on == "v100-2"
        assert read_layout(layout_of(st, row)).plan_id == "st1"


def test_replan_moves_a_requeued_job_in_place(tmp_path: Path) -> None:
    """A node goes down under a running job: Slurm requeues it (pending again); replan
    moves it to the other v100 node in place, same id, and it runs there."""
    from slurm_helpers import make_testbed_plan, throughput_rows

    from hetsched.app.replan import replan
    from hetsched.core.throughput import ThroughputTable

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, """jobs:
  - {name: A, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 2, max_gpus: 2, command: [train]}
  - {name: B, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [t4], min_gpus: 2, max_gpus: 2, command: [train]}
""")
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()
        a_node = slurm.jobs_by_id[ids["A"]].comps[0].running_on
        slurm.node_down(a_node)
        r = replan(st, slurm, ThroughputTable(throughput_rows()))
        assert r.updated == [("A", ids["A"])] and not r.cancelled and not r.submitted
        assert "B" in r.kept
        (change,) = [c for c in r.changes if c.job == "A"]
        assert "updated in place" in change.why and a_node in change.was
        assert latest_rows(st)["A"].slurm_id == ids["A"]
        slurm.schedule()
        other = "v100-2" if a_node == "v100-1" else "v100-1"
        assert [c.running_on for c in slurm.jobs_by_id[ids["A"]].comps] == [other]


def test_submit_refuses_a_gpu_type_its_node_lacks(tmp_path: Path) -> None:
    """Pinned scripts ask for untyped GPUs, so hetsched checks the type itself."""
    import pytest

    from hetsched.errors import InputError

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = contract_plan("ty1", {"ok": [_w("t4-1", "t4", 8)], "bad": [_w("a100-1", "h100", 8)]})
    with open_store(tmp_path / "s.db") as st, pytest.raises(InputError) as ei:
        submit(plan, st, slurm)
    assert "job 'bad': it has h100 GPUs on node a100-1, which Slurm says has a100 GPUs" \
        in str(ei.value) and "\n" not in str(ei.value)
    assert slurm.count("sbatch") == 0


def test_submit_refuses_a_plan_made_for_another_clusters_nodes(tmp_path: Path) -> None:
    """A plan made with a cluster file whose node names the partition lacks: before,
    sbatch said only "Invalid node name specified", at the first job; now one line names
    the job, the node and the partition's nodes, before anything reaches Slurm."""
    import pytest
    from pool_slurm_helpers import pool_plan

    from hetsched.app.pool_submit import submit_pool
    from hetsched.errors import InputError

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = contract_plan("nd1", {"ok": [_w("t4-1", "t4", 8)], "far": [_w("gpu-7", "v100", 8)]})
    with open_store(tmp_path / "s.db") as st, pytest.raises(InputError) as ei:
        submit(plan, st, slurm)
    msg = str(ei.value)
    assert "job 'far': it runs on node gpu-7, which Slurm does not have (its nodes: " \
        "a100-1, t4-1, v100-1, v100-2)" in msg and "\n" not in msg, msg
    pool = pool_plan([("gpu-1", "a100", 1), ("gpu-2", "v100", 1)], prefix="nd")
    with open_store(tmp_path / "s.db") as st, pytest.raises(InputError) as ei:
        submit_pool(pool, st, slurm, partition="gpu")
    assert "tasks: it runs on node gpu-1, which partition gpu does not have" in str(ei.value)
    assert slurm.count("sbatch") == 0
