"""A plan with a co-location group and isolated jobs, submitted to the real testbed.

The job steps run the testbed's stand-in for `hetsched` (it prints its
arguments and sleeps): this is about what Slurm is given. The group is one
Slurm job holding both shared GPUs, one task per GPU each started with
`run --group g1`; the isolated job planned after it on one of those GPUs
waits for it (Dependency); a crash between sbatch and recording the group's
id is recovered from the tag, not submitted twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from group_helpers import group_job, group_plan
from slurm_helpers import wait_for

from hetsched.app.submit import check_plan, files_dir, submit
from hetsched.core.groups import plan_groups
from hetsched.core.plan import Plan
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.group_script import group_comment, render_group
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

SLOTS = (("v100-1", "v100", 0), ("v100-1", "v100", 1))


def _plan(prefix: str) -> Plan:
    return group_plan([
        group_job(f"{prefix}a", "mlp", (6, 10), dataset_size=64, slots=SLOTS, end_s=100.0),
        group_job(f"{prefix}b", "cnn", (3, 5), dataset_size=40, slots=SLOTS, end_s=90.0),
        group_job(f"{prefix}c", "mlp", (8,), dataset_size=64, slots=SLOTS[:1], group=None,
                  start_s=100.0, end_s=150.0),
        group_job(f"{prefix}d", "mlp", (8,), dataset_size=64, slots=(("t4-1", "t4", 0),),
                  group=None),
    ])


def _active(client: CliSlurmClient, pid: str) -> list:
    return [j for j in client.jobs()
            if j.comment.startswith(f"hetsched:{pid}:") and not j.finished]


def test_group_is_one_slurm_job_in_the_plans_order(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "4")
    plan = _plan("gs")
    with open_store(tmp_path / "state.db") as st:
        res = submit(plan, st, client, partition="gpu")
        ids = dict(res.submitted)
        pid = res.plan_id
    assert ids["gsa"] == ids["gsb"] and len(set(ids.values())) == 3
    group = [j for j in _active(client, pid) if j.leader == ids["gsa"]]
    assert len(group) == 1 and group[0].comment == group_comment(pid, "g1")
    assert "v100:2" in group[0].gres, group[0].gres
    wait_for(lambda: any(j.state == "RUNNING" for j in _active(client, pid)
                         if j.leader == ids["gsa"]), 30, "the group's job to run")
    waiting = [j for j in _active(client, pid) if j.leader == ids["gsc"]]
    assert waiting and waiting[0].reason == "Dependency", waiting
    wait_for(lambda: not _active(client, pid), 90, "every job of the plan to finish")
    log = files_dir_log(tmp_path, ids["gsa"])
    starts = sorted(ln for ln in log.splitlines() if ln.startswith("fake hetsched run"))
    assert len(starts) == 2, log  # one task per shared GPU, each running the whole group
    for rank, ln in enumerate(starts):
        assert ln.endswith(f"--group g1 rank={rank}"), ln
        assert "--job" not in ln


def files_dir_log(tmp: Path, slurm_id: str) -> str:
    logs = list((tmp / "state.db.files" / "logs").glob(f"*-{slurm_id}.out"))
    return "\n".join(p.read_text() for p in logs)


def test_crash_after_the_groups_sbatch_is_recovered(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The members' intents are recorded and the group's job is in Slurm, its id not
    stored (a crash between the two): a re-run finds it by its tag."""
    monkeypatch.setenv("HETSCHED_TEST_SLEEP", "30")
    plan = _plan("gr")
    with open_store(tmp_path / "state.db") as st:
        pid = check_plan(plan)
        st.add_plan(plan.to_dict())
        view = plan_groups(plan)["g1"]
        script = render_group(pid, view, plan_path=files_dir(st) / "p.json",
                              log_dir=tmp_path, partition="gpu")
        for m in view.members:
            st.begin_submission(pid, m.job, 0, script.sha256, "", [])
        (tmp_path / "g.sh").write_text(script.text)
        real_id = client.submit(tmp_path / "g.sh")
        res = submit(plan, st, client, partition="gpu")
        assert sorted(res.skipped) == [("gra", real_id), ("grb", real_id)]
        assert sorted(n for n, _ in res.submitted) == ["grc", "grd"]
        assert {st.submission(pid, m.job, 0).slurm_id for m in view.members} == {real_id}
    tags = sorted(j.comment for j in _active(client, pid) if not j.het_offset)
    assert tags.count(group_comment(pid, "g1")) == 1
