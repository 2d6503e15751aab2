"""Submit decisions on the in-memory Slurm (fast; the testbed tests hold the real thing).

Plan order as dependencies, all-or-nothing on an sbatch failure and on
SIGINT mid-batch, and the sbatch options (time limit, signal, account...).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from slurm_helpers import contract_plan

from hetsched.app.order import predecessors
from hetsched.app.submit import SubmitError, SubmitInterrupted, submit
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptions
from hetsched.io.plan_json import plan_from_dict
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store


def staged_plan(pid: str) -> Plan:
    """A on t4 GPUs 0-1 first; B after A on the same GPUs although 2-3 stay idle; C on 2-3."""
    d = contract_plan(pid, {"A": [[("t4-1", "t4", 4), ("t4-1", "t4", 4)]],
                            "B": [[("t4-1", "t4", 4), ("t4-1", "t4", 4)]],
                            "C": [[("t4-1", "t4", 4)]]}).to_dict()
    jobs = {j["name"]: j for j in d["jobs"]}
    seg_b = jobs["B"]["segments"][0]
    seg_b["start_s"], seg_b["end_s"] = 100.0, 200.0
    jobs["B"]["start_s"], jobs["B"]["end_s"] = 100.0, 200.0
    seg_c = jobs["C"]["segments"][0]
    seg_c["start_s"], seg_c["end_s"] = 200.0, 300.0
    jobs["C"]["start_s"], jobs["C"]["end_s"] = 200.0, 300.0
    for w in seg_c["workers"]:
        w["gpu"] = 2
    return plan_from_dict(d, "test")


def test_dependencies_make_slurm_follow_the_plan(tmp_path: Path) -> None:
    plan = staged_plan("ord1")
    assert predecessors(plan) == {"B": ["A"]}
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        res = submit(plan, st, slurm)
    ids = dict(res.submitted)
    assert res.order == ["A", "B", "C"]
    sbatch_args = [a for c, a in slurm.calls if c == "sbatch"]
    assert sbatch_args[1][1:] == (f"--dependency=afterany:{ids['A']}",)
    assert sbatch_args[0][1:] == () and sbatch_args[2][1:] == ()
    # GPUs 2-3 are free, yet B waits for A: the plan's order, not backfill's
    assert slurm.schedule() == [ids["A"], ids["C"]]
    assert slurm.jobs_by_id[ids["B"]].reason == "Dependency"
    slurm.finish(ids["A"])
    assert slurm.schedule() == [ids["B"]]


def test_sbatch_failure_rolls_back_everything(tmp_path: Path) -> None:
    plan = contract_plan("rb1", {f"j{i}": [[("v100-1", "v100", 4)]] for i in range(6)})
    slurm = MemorySlurm(fail_submit_at={4})
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(SubmitError, match="4 of 6"):
            submit(plan, st, slurm)
        assert st.submissions() == []
    assert slurm.active() == []
    assert slurm.count("scancel") == 1


def test_sigint_mid_submit_rolls_back_the_batch(tmp_path: Path) -> None:
    plan = contract_plan("int1", {f"j{i:02d}": [[("v100-1", "v100", 4)]] for i in range(30)})
    slurm = MemorySlurm()
    slurm.on_submit = lambda jid: (os.kill(os.getpid(), signal.SIGINT)
                                   if slurm.count("sbatch") == 12 else None)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the tests run under `&`
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(SubmitInterrupted, match="SIGINT after 12 of 30"):
            submit(plan, st, slurm)
        assert st.submissions() == []
        assert [e["kind"] for e in st.events()] == ["submit-rollback"]
    assert slurm.active() == []
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found, back


def test_sbatch_options_reach_every_component(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_SBATCH_ACCOUNT", "site-acct")
    monkeypatch.setenv("HETSCHED_SBATCH_QOS", "normal")
    d = contract_plan("opt1", {"J": [[("a100-1", "a100", 8), ("t4-1", "t4", 4)]],
                               "K": [[("t4-1", "t4", 4)]]}).to_dict()
    d["jobs"][0]["spec"]["slurm"] = {"qos": "high", "mem": "16G", "extra": ["--exclusive"]}
    plan = plan_from_dict(d, "test")
    res = submit(plan, None, None, dry_run=True,
                 sbatch=SbatchOptions(constraint="ib&fast", time="2:00:00"))
    j = res.scripts["J"].text
    assert j.count("#SBATCH --qos=high") == 2 and j.count("#SBATCH --mem=16G") == 2
    assert j.count("#SBATCH --exclusive") == 2 and j.count("#SBATCH --constraint=ib&fast") == 2
    assert "--account=" not in j  # sbatch= given: the caller already merged the config
    k = res.scripts["K"].text
    assert "#SBATCH --time=2:00:00" in k and "--qos=" not in k


def test_time_limit_from_predicted_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_SBATCH_ACCOUNT", "site-acct")
    plan = contract_plan("tl1", {"J": [[("t4-1", "t4", 4)]]})  # 100 s predicted
    text = submit(plan, None, None, dry_run=True).scripts["J"].text
    # 100 s x 1.5 + 600 s = 750 s -> 13 min; SIGTERM 300 s before
    assert "#SBATCH --time=13\n" in text and "#SBATCH --signal=B:USR1@300\n" in text
    assert "#SBATCH --account=site-acct" in text  # the config's default
    assert "scontrol requeue" in text
    monkeypatch.setenv("HETSCHED_TIME_MARGIN", "3")
    monkeypatch.setenv("HETSCHED_TIME_PAD", "0")
    monkeypatch.setenv("HETSCHED_SIGNAL_S", "0")
    text = submit(plan, None, None, dry_run=True).scripts["J"].text
    assert "#SBATCH --time=5\n" in text and "--signal" not in text
    assert "scontrol requeue" not in text


def test_status_shows_the_true_state_of_a_killed_submit(tmp_path: Path) -> None:
    from hetsched.app.status import batch_status

    plan = contract_plan("kill1", {"k1": [[("t4-1", "t4", 4)]], "k2": [[("t4-1", "t4", 4)]],
                                   "k3": [[("t4-1", "t4", 4)]]})
    slurm = MemorySlurm()

    def die(jid: str) -> None:  # what kill -9 leaves: sbatch done, its id never recorded
        if slurm.count("sbatch") == 2:
            raise SystemExit("killed")
    slurm.on_submit = die
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(SystemExit):
            submit(plan, st, slurm)
        jobs = {j.job: j for j in batch_status(st, slurm)}
    assert jobs["k1"].state == "PENDING" and jobs["k1"].slurm_id != "-"
    assert jobs["k2"].state == "PENDING" and jobs["k2"].slurm_id == slurm.active()[1]
    assert "not recorded" in jobs["k2"].reason
    assert jobs["k3"].state == "NOT_SUBMITTED"


@pytest.mark.parametrize(("slurm", "where"), [
    ({"time": "two hours"}, "slurm.time"), ({"mem": "lots"}, "slurm.mem"),
    ({"extra": ["--gres=gpu:8"]}, "slurm.extra"), ({"qos": "a b"}, "slurm.qos"),
    ({"extra": ["--x=$(id)"]}, "slurm.extra"), ({"tiem": "1"}, "slurm.tiem")])
def test_bad_sbatch_options_are_one_line(slurm: dict, where: str, tmp_path: Path) -> None:
    import subprocess

    import yaml
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [{"name": "a", "workload": "w", "dataset_size": 10,
                                              "epochs": 1, "global_batch": 2,
                                              "slurm": slurm}]}))
    r = subprocess.run(["hetsched", "submit", str(jobs), "--throughputs", "x.csv", "--dry-run"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert where in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_cli_and_config_options_and_their_errors(tmp_path: Path) -> None:
    import subprocess

    pf = tmp_path / "plan.json"
    pf.write_text(contract_plan("cli2", {"J": [[("t4-1", "t4", 4)]]}).to_json())
    env = {**os.environ, "HETSCHED_SBATCH_QOS": "low", "HETSCHED_SBATCH_EXTRA": "--exclusive"}
    r = subprocess.run(["hetsched", "submit", str(pf), "--dry-run", "--qos", "high",
                        "--account", "acct", "--sbatch-option=--mail-type=END"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --qos=high" in r.stdout and "#SBATCH --account=acct" in r.stdout
    assert "#SBATCH --exclusive" in r.stdout and "#SBATCH --mail-type=END" in r.stdout
    r = subprocess.run(["hetsched", "submit", str(pf), "--dry-run"], capture_output=True,
                       text=True, env={**env, "HETSCHED_SBATCH_MEM": "1 G"})
    assert r.returncode == 2 and "sbatch_mem" in r.stderr, r.stderr
