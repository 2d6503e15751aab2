"""Submitting a pool-mode plan: one hetjob for the whole pool (rendering, dry run, testbed).

The fast tests render and dry-run real pool plans (the planner's own); the
``slurm`` ones submit them to the real testbed with a stand-in executor
(the session's ``fake-hetsched``, which sleeps), so they check what Slurm
was given, the store's rows, idempotence and the rollback.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from pool_slurm_helpers import pool_plan
from slurm_helpers import invoke, wait_for

from hetsched.app.pool_submit import EXECUTOR_WORKLOADS, POOL_KEY, task_sequences
from hetsched.app.runnable import UnrunnableError
from hetsched.app.submit import SubmitError, files_dir, submit
from hetsched.cli import slurm as cli_slurm
from hetsched.planning.pool.compact import expand_runs
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.pool_script import pool_comment, pool_gpus, render_pool
from hetsched.slurm.templates import TemplateValueError
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

NODES = [("a100-1", "a100", 2), ("v100-1", "v100", 1), ("v100-2", "v100", 1)]


def _write(tmp_path: Path, plan: object, name: str = "pool.json") -> Path:
    p = tmp_path / name
    p.write_text(plan.to_json())  # type: ignore[attr-defined]
    return p


def test_dry_run_prints_one_hetjob_and_each_gpus_tasks(tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="dr")
    state = tmp_path / "state.db"
    res = CliRunner().invoke(cli_slurm.submit_cmd, [str(_write(tmp_path, plan)), "--dry-run",
                                                    "--state", str(state), "-p", "gpu"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    # one script; one component per (GPU type, node) with typed GRES
    assert out.count("#!/bin/bash") == 1
    gpus = pool_gpus(plan.tasks)
    groups = {(g.gpu_type, g.node) for g in gpus}
    assert out.count("#SBATCH hetjob") == len(groups) - 1
    for t, n in groups:
        k = sum(1 for g in gpus if (g.gpu_type, g.node) == (t, n))
        assert f"--gres=gpu:{t}:{k}\n#SBATCH --nodelist={n}\n" in out
    assert "--partition=gpu" in out and "--no-requeue" in out
    # one executor per GPU in step order; never space mode's `run --job`
    ids = ",".join(g.gpu_id for g in gpus)
    assert f"export HETSCHED_POOL_GPUS={ids}\n" in out
    assert " exec --plan " in out
    assert " run --plan" not in out and "--job " not in out
    # each GPU's task sequence, compact: every task of the plan appears once
    lines = [ln for ln in out.splitlines() if ln.startswith("# GPU ")]
    assert len(lines) == len(gpus)
    assert sum(int(ln.split(", ")[1].split()[0]) for ln in lines) == plan.tasks.total_tasks  # type: ignore[union-attr]
    assert "nothing submitted" in res.stderr
    assert not state.exists()
    # the printed script is itself a valid shell script
    subprocess.run(["bash", "-n"], input=out, text=True, check=True)


def test_sbatch_options_and_time_limit_reach_every_component(tmp_path: Path) -> None:
    import math

    plan = pool_plan(NODES, prefix="so")
    pf = _write(tmp_path, plan)
    res = CliRunner().invoke(cli_slurm.submit_cmd, [str(pf), "--dry-run", "--account", "ml",
                                                    "--qos", "high"])
    assert res.exit_code == 0, res.output
    n = len({(g.gpu_type, g.node) for g in pool_gpus(plan.tasks)})  # components
    assert res.stdout.count("#SBATCH --account=ml\n") == n
    assert res.stdout.count("#SBATCH --qos=high\n") == n
    # no --time given: the limit follows the plan's makespan (margin and pad from config)
    from hetsched.app.submit import time_limit

    limit = time_limit(plan.makespan_s)[0]
    assert limit >= math.ceil(plan.makespan_s / 60)
    assert res.stdout.count(f"#SBATCH --time={limit}\n") == n
    res = CliRunner().invoke(cli_slurm.submit_cmd, [str(pf), "--dry-run", "--time", "2:00:00"])
    assert res.exit_code == 0, res.output
    assert res.stdout.count("#SBATCH --time=2:00:00\n") == n


def test_task_sequences_are_compact_and_complete() -> None:
    plan = pool_plan([("a100-1", "a100", 1), ("v100-1", "v100", 1)], prefix="cs",
                     task_iterations=5)
    seqs = task_sequences(plan)
    assert seqs[0].startswith("task sequence per GPU")
    assert plan.tasks is not None
    for g, line in zip(plan.tasks.gpus, seqs[1:], strict=True):
        rows = expand_runs(list(g.runs))
        # rows stored as runs: the line is shorter than the expanded sequence
        assert f"({g.gpu_type}, {len(rows)} tasks)" in line
        assert line.count(" r") <= len(rows)
        if any(r.repeat > 1 for r in g.runs):
            assert " x" in line and line.count(" r") < len(rows)


def test_pool_plan_is_never_rendered_as_space_hetjobs(tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="nv")
    res = submit(plan, None, None, dry_run=True, partition="gpu")
    assert set(res.scripts) == {POOL_KEY}
    assert len(res.scripts[POOL_KEY].components) == 3
    # and the pool renderer refuses a space-mode plan
    space = pool_plan(NODES, prefix="nv")
    space.mode, space.tasks = "space", None
    with pytest.raises(TemplateValueError, match="pool-mode plan"):
        render_pool(space, "x", plan_path="p", log_dir="l", report_dir="r", checkpoint_dir="c")


def test_a_pool_plan_without_tasks_is_one_clear_line(tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="nt")
    body = plan.to_dict()
    body["tasks"]["gpus"] = [dict(g, tasks=0) for g in body["tasks"]["gpus"]]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(body))
    code, out = invoke(cli_slurm.submit_cmd, [str(p), "--dry-run"])
    assert code == 2 and "no GPU with tasks" in out and "Traceback" not in out


def test_jobs_the_executor_cannot_train_are_refused_before_anything(tmp_path: Path) -> None:
    import dataclasses

    plan = pool_plan(NODES, prefix="nr")
    j = plan.jobs[0]
    assert j.spec is not None
    j.spec = dataclasses.replace(j.spec, workload="resnet-50", command=("python", "t.py"))
    with open_store(tmp_path / "state.db") as st:
        with pytest.raises(UnrunnableError) as ei:
            submit(plan, st, None, partition="gpu")
        assert st.submissions() == [] and st.plans() == []
    msg = str(ei.value)
    assert "nra" in msg and "'resnet-50' is not a built-in" in msg and "space mode" in msg
    assert "\n" not in msg


def test_executor_workloads_match_the_runtime() -> None:
    workloads = pytest.importorskip("hetsched.runtime.workloads")
    assert set(workloads.BUILTINS) == EXECUTOR_WORKLOADS


def test_gpu_ids_match_the_executor() -> None:
    exec_plan = pytest.importorskip("hetsched.runtime.executor.plan")
    plan = pool_plan(NODES, prefix="id")
    ours = {g.gpu_id: (g.node, g.index) for g in pool_gpus(plan.tasks)}
    theirs = exec_plan.exec_plan(plan).gpus
    assert ours == {k: (g.node, g.index) for k, g in theirs.items() if g.tasks}


# ---------------------------------------------------------------------------
# on the testbed (the session's stand-in executor sleeps)


def _active(client: CliSlurmClient, pid: str) -> list:
    return [j for j in client.jobs() if j.comment == pool_comment(pid) and not j.finished]


@pytest.mark.slurm
def test_submit_pool_is_one_hetjob_and_idempotent(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="id1")
    with open_store(tmp_path / "state.db") as st:
        res = submit(plan, st, client, partition="gpu")
        pid = res.plan_id
        ids = {jid for _, jid in res.submitted}
        assert len(ids) == 1 and {n for n, _ in res.submitted} == {j.name for j in plan.jobs}
        jid = ids.pop()
        rows = st.submissions(pid)
        assert {r.slurm_id for r in rows} == {jid} and len(rows) == 3
        comps = [j for j in client.jobs() if j.leader == jid]
        assert sorted(j.het_offset or 0 for j in comps) == [0, 1, 2]
        assert sorted(j.gres for j in comps) == ["gres:gpu:a100:2", "gres:gpu:v100:1",
                                                "gres:gpu:v100:1"]
        assert (files_dir(st) / "plans" / f"{pid}.json").exists()
        again = submit(plan, st, client, partition="gpu")
        assert again.submitted == [] and {i for _, i in again.skipped} == {jid}
    assert len({j.leader for j in _active(client, pid)}) == 1
    wait_for(lambda: all(j.state == "RUNNING" for j in _active(client, pid)), 30,
             "the pool hetjob to run")


@pytest.mark.slurm
def test_crash_after_sbatch_is_recovered_without_a_second_job(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="cr1")
    with open_store(tmp_path / "state.db") as st:
        pid = plan.to_dict()["plan_id"]
        st.add_plan(plan.to_dict())
        script = render_pool(plan, pid, plan_path=tmp_path / "p.json", log_dir=tmp_path,
                             report_dir=tmp_path / "r", checkpoint_dir=tmp_path / "c",
                             partition="gpu")
        for j in plan.jobs:  # what a crash leaves: intents, the job in Slurm, no id stored
            st.begin_submission(pid, j.name, 0, script.sha256, "", [])
        (tmp_path / "pool.sh").write_text(script.text)
        real = client.submit(tmp_path / "pool.sh")
        res = submit(plan, st, client, partition="gpu")
        assert res.submitted == [] and {i for _, i in res.skipped} == {real}
        assert {r.slurm_id for r in st.submissions(pid)} == {real}
    assert {j.leader for j in _active(client, pid)} == {real}


@pytest.mark.slurm
def test_failed_sbatch_rolls_back(testbed: Testbed, client: CliSlurmClient, clean_queue: None,
                                  tmp_path: Path) -> None:
    # a node the partition has with a GPU type it lacks: sbatch refuses the job
    plan = pool_plan([("a100-1", "a100", 1), ("v100-1", "v100", 1)], prefix="rb1")
    assert plan.tasks is not None
    plan.tasks.gpus = [dataclasses.replace(g, gpu_type="h100") if g.node == "v100-1" else g
                       for g in plan.tasks.gpus]
    with open_store(tmp_path / "state.db") as st:
        with pytest.raises(SubmitError) as ei:
            submit(plan, st, client, partition="gpu")
        msg = str(ei.value)
        assert "sbatch failed for pool plan" in msg and "nothing from this run remains" in msg
        assert st.submissions() == []
        assert any(e["kind"] == "submit-rollback" for e in st.events())
    pid = plan.to_dict()["plan_id"]
    wait_for(lambda: _active(client, pid) == [], 15, "no pool job left")
    code, out = invoke(cli_slurm.submit_cmd, [str(_write(tmp_path, plan)), "--state",
                                              str(tmp_path / "s2.db"), "-p", "gpu"])
    assert code == 3 and "nothing from this run remains queued" in out
