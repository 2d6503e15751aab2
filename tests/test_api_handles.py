"""The Python API's inputs (paths, dicts, objects), its error names, and the job
handles `hetsched.submit` returns, on the in-memory Slurm (tests/slurm has the testbed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

import hetsched
from hetsched.slurm.memory import MemorySlurm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "slurm"))


def test_plan_takes_paths_dicts_and_objects(examples: dict[str, Path]) -> None:
    by_path = hetsched.plan(str(examples["jobs"]), examples["cluster"], examples["throughputs"],
                            policy="fifo")
    jobs_doc = yaml.safe_load(examples["jobs"].read_text())
    cluster_doc = yaml.safe_load(examples["cluster"].read_text())
    from dataclasses import asdict

    from hetsched.io.profiles import parse_csv

    rows = [asdict(r) for r in parse_csv(examples["throughputs"].read_text(), "csv")]
    by_dict = hetsched.plan(jobs_doc, cluster_doc, rows, policy="fifo")
    by_list = hetsched.plan(jobs_doc["jobs"], cluster_doc,
                            hetsched.load_profiles(examples["throughputs"]), policy="fifo")
    objs = hetsched.plan(hetsched.load_jobs(examples["jobs"]),
                         hetsched.load_cluster(examples["cluster"]),
                         hetsched.load_profiles(examples["throughputs"]), policy="fifo")
    want = objs.weighted_jct_s
    assert by_path.weighted_jct_s == by_dict.weighted_jct_s == by_list.weighted_jct_s == want


def test_api_errors_name_the_argument_not_a_flag(examples: dict[str, Path]) -> None:
    ins = (examples["jobs"], examples["cluster"], examples["throughputs"])
    with pytest.raises(hetsched.InputError) as e:
        hetsched.plan(*ins, policy="no-such-policy")
    assert str(e.value).startswith("policy: unknown policy 'no-such-policy'")
    with pytest.raises(hetsched.InputError) as e:
        hetsched.plan(*ins, policy="has", params={"nope": 1})
    assert str(e.value).startswith("params:") and "--" not in str(e.value).split(":")[0]
    with pytest.raises(hetsched.InputError, match="^jobs: "):
        hetsched.plan({"jobs": [{"name": "x"}]}, *ins[1:])
    with pytest.raises(hetsched.InputError, match="^jobs: give a jobs YAML path"):
        hetsched.plan([1, 2], *ins[1:])
    with pytest.raises(hetsched.InputError, match="^profiles: row 0"):
        hetsched.plan(*ins[:2], [{"workload": "w"}])
    jobs = yaml.safe_load(examples["jobs"].read_text())["jobs"]
    huge = [*jobs, {**jobs[0], "name": "huge", "global_batch": 10**7}]
    with pytest.raises(hetsched.InputError, match="pass skip_unplaceable=True") as e:
        hetsched.plan(huge, *ins[1:])
    assert "--" not in str(e.value)
    some = hetsched.plan(huge, *ins[1:], policy="fifo", skip_unplaceable=True)
    assert [j.name for j in some.jobs] == [j["name"] for j in jobs]


def test_plan_plans_as_the_command_line_does(examples: dict[str, Path], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same inputs, the same plan as `hetsched plan`: no profiles reads the profile
    history of the state file, the restart cost is the configured one, and the plan's
    objective and placement equal the command line's (a subprocess, stdout's JSON)."""
    import json
    import os
    import subprocess

    from hetsched.io.profiles import parse_csv
    from hetsched.state.history import import_rows
    from hetsched.state.store import open_store

    state = tmp_path / "s.db"
    with open_store(state) as st:
        import_rows(st, parse_csv(examples["throughputs"].read_text(), "csv"), "test")
    monkeypatch.setenv("HETSCHED_STATE", str(state))
    monkeypatch.setenv("HETSCHED_RESTART_COST", "10")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    got = hetsched.plan(examples["jobs"], examples["cluster"], policy="has")
    assert got.restart_cost_s == 10.0
    cli = subprocess.run([sys.executable, "-m", "hetsched", "plan", str(examples["jobs"]),
                          "--cluster", str(examples["cluster"]), "--policy", "has",
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)
    assert want["restart_cost_s"] == 10.0
    assert got.weighted_jct_s == pytest.approx(want["objective"]["weighted_jct_s"], abs=1e-4)
    assert json.loads(got.to_json())["jobs"] == want["jobs"]  # every segment and share
    monkeypatch.setenv("HETSCHED_STATE", str(tmp_path / "none.db"))
    # the state file named, as submit's state=: the same history, the same plan
    named = hetsched.plan(examples["jobs"], examples["cluster"], policy="has", state=state)
    assert json.loads(named.to_json())["jobs"] == want["jobs"]
    with pytest.raises(hetsched.InputError, match="^state: no state file at "):
        hetsched.plan(examples["jobs"], examples["cluster"], state=tmp_path / "nope.db")
    with pytest.raises(hetsched.InputError, match="^profiles: no throughput CSV given") as e:
        hetsched.plan(examples["jobs"], examples["cluster"])
    assert "pass profiles=profiles.csv" in str(e.value) and "--" not in str(e.value), e.value


def test_submit_takes_sbatch_options_as_the_command_line_does(examples: dict[str, Path],
                                                               tmp_path: Path) -> None:
    plan = hetsched.plan(*(examples[k] for k in ("jobs", "cluster", "throughputs")),
                         policy="fifo")
    batch = hetsched.submit(plan, dry_run=True, sbatch={"account": "proj-7", "time": "00:30:00"})
    texts = [s.text for s in batch.scripts.values()]
    assert texts and all("#SBATCH --account=proj-7" in t for t in texts)
    assert all("#SBATCH --time=00:30:00" in t for t in texts)
    with pytest.raises(hetsched.InputError, match="^sbatch: unknown sbatch key 'acount'"):
        hetsched.submit(plan, dry_run=True, sbatch={"acount": "x"})


def test_submit_returns_handles_that_follow_the_job(tmp_path: Path) -> None:
    from slurm_helpers import contract_plan

    slurm = MemorySlurm()
    plan = contract_plan("api1", {"a": [[("t4-1", "t4", 4)]], "b": [[("v100-1", "v100", 4)]],
                                  "c": [[("a100-1", "a100", 2)]]})
    batch = hetsched.submit(plan, state=tmp_path / "s.db", client=slurm)
    assert set(batch.jobs) == {"a", "b", "c"} and len(batch) == 3
    assert dict(batch.submitted)["a"] == batch["a"].slurm_id  # the result's fields too
    assert batch.states() == {"a": "PENDING", "b": "PENDING", "c": "PENDING"}
    slurm.schedule()
    assert batch["a"].state == "RUNNING" and not batch["a"].done()
    with pytest.raises(TimeoutError, match="still RUNNING"):
        batch["a"].wait(timeout_s=0.0, poll_s=0.0)
    log = tmp_path / "s.db.files" / "logs" / f"a-{batch['a'].slurm_id}.out"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("epoch 1\nTraceback (most recent call last):\nValueError: nan loss\n")
    slurm.finish(batch["a"].slurm_id, "FAILED", "NonZeroExitCode")
    assert batch["a"].wait(poll_s=0.0) == "FAILED" and batch["a"].done()
    assert batch["a"].stdout().startswith("epoch 1") and "nan loss" in batch["a"].stderr()
    assert batch["a"].log_path() == log
    batch["b"].cancel(reason="not needed")
    assert slurm.jobs_by_id[batch["b"].slurm_id].state == "CANCELLED"
    assert batch["b"].state == "CANCELLED" and "not needed" in batch["b"].result()["reason"]
    slurm.finish(batch["c"].slurm_id)
    res = batch["c"].result()
    assert res["state"] == "COMPLETED" and res["predicted_jct_s"] is not None
    assert batch.wait(poll_s=0.0) == {"a": "FAILED", "b": "CANCELLED", "c": "COMPLETED"}
    assert batch["c"].stdout() == ""  # no log file (Slurm wrote none here)


def test_dry_run_renders_scripts_without_handles(examples: dict[str, Path]) -> None:
    plan = hetsched.plan(*(examples[k] for k in ("jobs", "cluster", "throughputs")),
                         policy="fifo")
    batch = hetsched.submit(plan, dry_run=True)
    assert len(batch.scripts) == 6 and len(batch) == 0
