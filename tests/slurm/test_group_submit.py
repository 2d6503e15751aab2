"""A co-location group is ONE Slurm job (app/group_submit.py), on the in-memory Slurm.

A plan with both a group and an isolated job submits both, in the plan's
order: the group's one script runs `hetsched run --group` (one task per
shared GPU), each member keeps a submission row with the group's Slurm id,
a job after a member waits for the group's job; a re-run submits nothing
twice; cancelling part of a group is refused; a replan moves a group whole.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from group_helpers import group_job, group_plan

from hetsched.app.cancel import cancel_jobs
from hetsched.app.replan_changes import decide_changes
from hetsched.app.submit import submit
from hetsched.core.plan import Plan
from hetsched.errors import InputError
from hetsched.io.plan_json import dump_plan, load_plan
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

SLOTS = (("v100-1", "v100", 0), ("v100-1", "v100", 1))


def mixed_plan(tmp: Path) -> Plan:
    """Group g1 (a, b) on v100-1 GPUs 0-1 for 100 s; then c alone on GPU 0; d alone on
    another node from the start."""
    plan = group_plan([
        group_job("a", "mlp", (6, 10), dataset_size=64, slots=SLOTS, end_s=100.0),
        group_job("b", "cnn", (3, 5), dataset_size=40, slots=SLOTS, end_s=90.0),
        group_job("c", "mlp", (8,), dataset_size=64, slots=SLOTS[:1], group=None,
                  start_s=100.0, end_s=150.0),
        group_job("d", "mlp", (8,), dataset_size=64, slots=(("t4-1", "t4", 0),), group=None),
    ])
    path = tmp / "plan.json"
    path.write_text(dump_plan(plan) + "\n")
    return load_plan(path)  # through the one reader, as submit gets it


def test_dry_run_renders_one_script_per_group(tmp_path: Path) -> None:
    plan = mixed_plan(tmp_path)
    res = submit(plan, None, None, dry_run=True)
    assert sorted(res.scripts) == ["c", "d", "group=g1"]
    assert res.order == ["d", "group=g1", "c"] or res.order == ["group=g1", "d", "c"]
    assert res.after == {"c": ["a"]}  # a member: the ids map gives it the group's job
    text = res.scripts["group=g1"].text
    srun = [ln for ln in text.splitlines() if ln.startswith("srun")]
    assert len(srun) == 1 and " run --plan " in srun[0] and srun[0].rstrip(" &").endswith("--group g1")
    assert "--job" not in srun[0]
    assert "#SBATCH --gres=gpu:v100:2" in text and "#SBATCH --ntasks=2" in text
    assert f"#SBATCH --comment=hetsched:{plan.plan_id}:group=g1:0" in text
    assert "export HETSCHED_RANK_NODES=v100-1,v100-1" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_submit_mixed_plan_rows_dependencies_idempotent(tmp_path: Path) -> None:
    plan = mixed_plan(tmp_path)
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        res = submit(plan, st, slurm)
        ids = dict(res.submitted)
        assert sorted(ids) == ["a", "b", "c", "d"]
        assert ids["a"] == ids["b"] and len({ids["a"], ids["c"], ids["d"]}) == 3
        sbatch = [a for c, a in slurm.calls if c == "sbatch"]
        assert len(sbatch) == 3
        by_script = {Path(a[0]).name: a[1:] for a in sbatch}
        assert by_script["c-0.sh"] == (f"--dependency=afterany:{ids['a']}",)
        assert by_script["group=g1-0.sh"] == ()
        rows = {s.job: s for s in st.submissions()}
        assert rows["a"].slurm_id == rows["b"].slurm_id == ids["a"]
        again = submit(plan, st, slurm)
        assert again.submitted == [] and dict(again.skipped) == ids
        assert len([c for c, _ in slurm.calls if c == "sbatch"]) == 3


def test_cancel_part_of_a_group_is_refused(tmp_path: Path) -> None:
    plan = mixed_plan(tmp_path)
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        with pytest.raises(InputError, match="cancel them together: hetsched cancel a b"):
            cancel_jobs(st, slurm, ["a"])
        assert ("scancel", (ids["a"],)) not in slurm.calls
        res = cancel_jobs(st, slurm, ["a", "b"])
        assert sorted(res.cancelled) == [("a", ids["a"]), ("b", ids["a"])]


def test_replan_moves_a_group_whole(tmp_path: Path) -> None:
    """The new plan moves only b: a, queued in the same Slurm job, moves with it."""
    plan = mixed_plan(tmp_path)
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        submit(plan, st, slurm)
        rows = {s.job: s for s in st.submissions()}
    moved = group_plan([
        group_job("a", "mlp", (6, 10), dataset_size=64, slots=SLOTS, group=None),
        group_job("b", "cnn", (8,), dataset_size=40, slots=(("t4-1", "t4", 1),), group=None),
        group_job("c", "mlp", (8,), dataset_size=64, slots=SLOTS[:1], group=None,
                  start_s=100.0),
        group_job("d", "mlp", (8,), dataset_size=64, slots=(("t4-1", "t4", 0),), group=None),
    ])
    dec = decide_changes(moved, rows, failed=frozenset(), running=frozenset({"RUNNING"}))
    assert dec.to_submit == {"a", "b"}
    assert sorted(r.job for r in dec.to_cancel) == ["a", "b"]
    assert "a" not in dec.kept and "d" in dec.kept
    assert any(c.job == "a" and "group" in c.why for c in dec.changes)


def test_memory_budget_from_the_clusters_gpu_memory(tmp_path: Path) -> None:
    """The cluster's GPU memory becomes the group's budget (--memory-budget-mb, MiB);
    without it the group runs without a limit."""
    plan = group_plan([group_job("a", "mlp", (4, 4), dataset_size=64, slots=SLOTS),
                       group_job("b", "mlp", (4, 4), dataset_size=64, slots=SLOTS)],
                      cluster={"name": "t", "nodes": [{"names": "v100-1", "gpu_type": "v100",
                                                       "gpus": 2, "gpu_memory_gb": 16}]})
    text = submit(plan, None, None, dry_run=True).scripts["group=g1"].text
    assert "--group g1 --memory-budget-mb 16384" in text
    text = submit(mixed_plan(tmp_path), None, None, dry_run=True).scripts["group=g1"].text
    assert "--memory-budget-mb" not in text


def test_members_on_different_gpus_are_refused(tmp_path: Path) -> None:
    plan = group_plan([group_job("a", "mlp", (4, 4), dataset_size=64, slots=SLOTS),
                       group_job("b", "mlp", (8,), dataset_size=64, slots=SLOTS[:1])])
    with pytest.raises(InputError, match="group 'g1': job 'b' .* does not run on the same "
                       "GPUs as job 'a'"):
        submit(plan, None, None, dry_run=True)


def test_a_command_job_cannot_join_a_group(tmp_path: Path) -> None:
    from hetsched.app.runnable import UnrunnableError

    plan = mixed_plan(tmp_path)
    spec = plan.job("b").spec
    assert spec is not None
    plan.job("b").spec = dataclasses.replace(spec, command=("python", "train.py"))
    with pytest.raises(UnrunnableError, match="job 'b' of group 'g1' is a command"):
        submit(plan, None, None, dry_run=True)


def test_the_harmony_policys_groups_submit_and_build(tmp_path: Path) -> None:
    """A plan of the `harmony` policy (planning side) reaches the running side whole:
    every group's members share GPUs as core.groups reads them, submit renders one script
    per group, and each member's local batches add up to its global batch."""
    from planner_helpers import make_cluster, make_job, make_table

    from hetsched.core.groups import plan_groups
    from hetsched.core.problem import PlanningProblem
    from hetsched.planning.space.evaluator import simulate
    from hetsched.planning.space.policies import make_policy

    cl = make_cluster([("n0", "v100", 2), ("n1", "v100", 2)], 100.0, 10.0)
    tab = make_table({("mlp", "v100"): (0.0, 0.01, 64), ("cnn", "v100"): (0.0, 0.001, 64)})
    jobs = [make_job(f"c{k}", "mlp", global_batch=64, dataset_size=64 * 200,
                     model_size_mb=10.0) for k in range(2)]
    jobs += [make_job(f"m{k}", "cnn", global_batch=64, dataset_size=64 * 200,
                      model_size_mb=600.0, min_gpus=4) for k in range(2)]
    plan = simulate(PlanningProblem(jobs, cl, tab), make_policy("harmony"))
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan) + "\n")
    plan = load_plan(path)
    groups = plan_groups(plan)
    assert groups, "the harmony policy made no group on this instance"
    for view in groups.values():
        for m in view.members:
            assert sum(m.local_batches) == plan.job(m.job).spec.global_batch
    res = submit(plan, None, None, dry_run=True)
    first = {g for g, v in groups.items() if all(m.segment == 0 for m in v.members)}
    assert {f"group={g}" for g in first} <= set(res.scripts)
    # on Slurm (in memory): one job per group; a group after another on the same GPUs
    # waits for the earlier group's job
    slurm = MemorySlurm(nodes_spec=(("n0", "v100", 2), ("n1", "v100", 2)))
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
    sbatch = {Path(a[0]).name: a[1:] for c, a in slurm.calls if c == "sbatch"}
    for g in first:
        view = groups[g]
        assert len({ids[m.job] for m in view.members}) == 1
        earlier = {ids[groups[o].members[0].job] for o in first
                   if groups[o].end_s <= view.start_s + 1e-6
                   and {(s.node, s.index) for s in groups[o].slots}
                   & {(s.node, s.index) for s in view.slots}}
        if earlier:
            dep = sbatch[f"group={g}-0.sh"]
            assert dep and set(dep[0].split(":")[1:]) & earlier, (g, sbatch)
    assert len(sbatch) == len(set(ids.values()))
