"""Submitting plans to the real testbed: all-or-nothing, idempotent, dry-run."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from slurm_helpers import contract_plan, invoke, wait_for

from hetsched.app.submit import SubmitError, files_dir, submit
from hetsched.cli import slurm as cli_slurm
from hetsched.core.plan import Plan
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.templates import submission_comment
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm


def _active(client: CliSlurmClient, plan_id: str) -> list:
    return [j for j in client.jobs()
            if j.comment.startswith(f"hetsched:{plan_id}:") and not j.finished]


def test_dry_run_touches_nothing(testbed: Testbed, client: CliSlurmClient, tmp_path: Path) -> None:
    plan = contract_plan("dry1", {"a": [[("a100-1", "a100", 8), ("t4-1", "t4", 4)]]})
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    state = tmp_path / "state.db"
    before = client.runner.total()
    res = CliRunner().invoke(cli_slurm.submit_cmd, [str(pf), "--dry-run", "--state", str(state)])
    assert res.exit_code == 0, res.output
    assert "#SBATCH hetjob" in res.output and "--gres=gpu:1\n#SBATCH --nodelist=t4-1" \
        in res.output
    assert not state.exists()
    assert client.runner.total() == before
    assert not _active(client, "dry1")


def test_submit_is_idempotent(testbed: Testbed, client: CliSlurmClient, clean_queue: None,
                              tmp_path: Path) -> None:
    plan = contract_plan("idem1", {
        "j1": [[("a100-1", "a100", 8), ("a100-1", "a100", 8), ("v100-1", "v100", 4)]],
        "j2": [[("t4-1", "t4", 4)]],
        "j3": [[("v100-2", "v100", 4), ("v100-2", "v100", 4)]],
    })
    with open_store(tmp_path / "state.db") as st:
        res = submit(plan, st, client, partition="gpu")
        assert [n for n, _ in res.submitted] == ["j1", "j2", "j3"]
        ids = dict(res.submitted)
        subs = {s.job: s for s in st.submissions("idem1")}
        assert {k: s.slurm_id for k, s in subs.items()} == ids
        assert (files_dir(st) / "plans" / "idem1.json").exists()
        # j1 is one hetjob with two components
        comps = [j for j in client.jobs() if j.leader == ids["j1"]]
        assert sorted(j.het_offset or 0 for j in comps) == [0, 1]
        again = submit(plan, st, client, partition="gpu")
        assert again.submitted == [] and dict(again.skipped) == ids
    assert len(_active(client, "idem1")) == 4  # 2 + 1 + 1 components
    wait_for(lambda: all(j.state == "RUNNING" for j in _active(client, "idem1")), 20,
             "all three hetjobs to run")


def test_crash_between_sbatch_and_record(testbed: Testbed, client: CliSlurmClient,
                                         clean_queue: None, tmp_path: Path) -> None:
    plan = contract_plan("crash1", {"c1": [[("t4-1", "t4", 4)]], "c2": [[("t4-1", "t4", 4)]]})
    with open_store(tmp_path / "state.db") as st:
        # what a crash leaves: the intent recorded and the job in Slurm, no id stored
        from hetsched.app.space_submit import check_plan, render_job_scripts
        pid = check_plan(plan)
        st.add_plan(plan.to_dict())
        _, script = render_job_scripts(plan, pid, plan_path=tmp_path / "p.json", log_dir=tmp_path,
                                partition="gpu")["c1"]
        sub = st.begin_submission("crash1", "c1", 0, script.sha256, "", [])
        (tmp_path / "c1.sh").write_text(script.text)
        real_id = client.submit(tmp_path / "c1.sh")
        assert getattr(st.submission("crash1", "c1", 0), "slurm_id", "") is None
        res = submit(plan, st, client, partition="gpu")
        assert res.skipped == [("c1", real_id)]
        assert [n for n, _ in res.submitted] == ["c2"]
        assert getattr(st.submission("crash1", "c1", 0), "slurm_id", "") == real_id
        assert sub.state == "SUBMITTING"
    tags = [j.comment for j in _active(client, "crash1")]
    assert sorted(tags) == [submission_comment("crash1", "c1", 0),
                            submission_comment("crash1", "c2", 0)]


def test_failure_mid_batch_leaves_no_orphans(testbed: Testbed, client: CliSlurmClient,
                                             clean_queue: None, tmp_path: Path) -> None:
    plan = contract_plan("fail1", {
        "f1": [[("a100-1", "a100", 8)]],
        "f2": [[("v100-1", "v100", 8), ("t4-1", "t4", 4)]],
        "f3": [[("a100-2", "a100", 8)] * 3],  # 3 GPUs on a 2-GPU node: sbatch refuses
        "f4": [[("t4-1", "t4", 4)]],
    })
    with open_store(tmp_path / "state.db") as st:
        with pytest.raises(SubmitError) as ei:
            submit(plan, st, client, partition="gpu")
        msg = str(ei.value)
        assert "'f3' (3 of 4)" in msg and "cancelled" in msg
        assert "sbatch" in msg and "not available" in msg  # Slurm's own words
        assert st.submissions("fail1") == []
        assert any(e["kind"] == "submit-rollback" for e in st.events())
    # scancel is asynchronous: a cancelled job passes through COMPLETING
    # for a moment before it ends; none may stay queued or running
    wait_for(lambda: _active(client, "fail1") == [], 15, "the rolled-back jobs to end")
    code, out = invoke(cli_slurm.submit_cmd, [str(_write(tmp_path, plan)), "--state",
                                              str(tmp_path / "s2.db")])
    assert code == 3 and "nothing from this run remains queued" in out
    wait_for(lambda: _active(client, "fail1") == [], 15, "the rolled-back jobs to end")


def test_submit_from_jobs_yaml_plans_on_slurm_inventory(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    pytest.importorskip("hetsched.planning.planner")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n"
                    "  - {name: y1, workload: w, dataset_size: 4096, epochs: 1, "
                    "global_batch: 64}\n"
                    "  - {name: y2, workload: w, dataset_size: 2048, epochs: 1, "
                    "global_batch: 32}\n")
    tp = tmp_path / "tp.csv"
    tp.write_text("workload,gpu_type,local_batch,step_time_s\n"
                  + "".join(f"w,{g},{b},{a + c * b:.4f}\n"
                            for g, a, c in (("a100", 0.01, 0.001), ("v100", 0.02, 0.002),
                                            ("t4", 0.04, 0.004)) for b in (8, 16, 32, 64)))
    res = CliRunner().invoke(cli_slurm.submit_cmd, [
        str(jobs), "--throughputs", str(tp), "--policy", "fifo", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert res.output.count("#!/bin/bash") == 2
    assert "--gres=gpu:" in res.output


def _write(tmp_path: Path, plan: Plan) -> Path:
    p = tmp_path / "plan.json"
    p.write_text(plan.to_json())
    return p


def test_parsable_prints_only_the_slurm_ids(testbed: Testbed, client: CliSlurmClient,
                                            clean_queue: None, tmp_path: Path) -> None:
    """`submit --parsable` prints one Slurm id per line and nothing else (sbatch --parsable)."""
    plan = contract_plan("pars1", {"p1": [[("t4-1", "t4", 2)]], "p2": [[("v100-1", "v100", 4)]]})
    res = CliRunner().invoke(cli_slurm.submit_cmd, [
        str(_write(tmp_path, plan)), "--state", str(tmp_path / "s.db"), "--parsable"])
    assert res.exit_code == 0, res.output
    ids = res.stdout.split()
    assert len(ids) == 2 and all(i.isdigit() for i in ids), res.stdout
    assert sorted(j.leader for j in _active(client, "pars1")) == sorted(ids)
    client.cancel(ids)
