"""End to end on the testbed: plan --mode pool -> submit -> the pool hetjob runs every task.

The real `hetsched exec` runs in the job step (one executor per pool GPU, rank
0 coordinating), with emulated GPU speeds (TEST-ONLY, runtime/emulate.py):
the profiles given to the planner are exactly the emulated step times, so the
plan's prediction can be compared with what the executors measured.

The fault test kills one executor process mid-run: the step ends every
executor, the Slurm job fails, `hetsched replan` plans the rounds not yet
checkpointed on the GPUs still up (a drained node left out) and submits them;
the rest completes and every job ends with all of its rounds. The node test
takes a pool node down mid-run (NODE_FAIL): the replan uses the node still up.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from pool_slurm_helpers import EMULATE_COST, EMULATE_SPEED, cluster_yaml, emulated_csv
from slurm_helpers import invoke, use_real_hetsched, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm

JOBS = """
jobs:
  - {name: %(p)sa, workload: mlp, dataset_size: 320, epochs: 1, global_batch: 16,
     requested_gpus: 1, weight: 2}
  - {name: %(p)sb, workload: mlp, dataset_size: 240, epochs: 1, global_batch: 16,
     requested_gpus: 2}
  - {name: %(p)sc, workload: mlp, dataset_size: 160, epochs: 1, global_batch: 8,
     requested_gpus: 1}
"""
#: the fault test's jobs: shorter (one iteration per task), its timing is not measured
SMALL_JOBS = """
jobs:
  - {name: %(p)sa, workload: mlp, dataset_size: 96, epochs: 1, global_batch: 16,
     requested_gpus: 1, weight: 2}
  - {name: %(p)sb, workload: mlp, dataset_size: 64, epochs: 1, global_batch: 16,
     requested_gpus: 2}
  - {name: %(p)sc, workload: mlp, dataset_size: 48, epochs: 1, global_batch: 8,
     requested_gpus: 1}
"""


@pytest.fixture()
def pool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real executor in the job steps, emulated speeds, reports under tmp_path."""
    pytest.importorskip("torch")
    use_real_hetsched(tmp_path, monkeypatch)
    monkeypatch.setenv("HETSCHED_EMULATE_SPEED",
                       ",".join(f"{k}={v}" for k, v in EMULATE_SPEED.items()))
    monkeypatch.setenv("HETSCHED_EMULATE_COST", ",".join(str(x) for x in EMULATE_COST))
    monkeypatch.setenv("HETSCHED_REPORT_DIR", str(tmp_path / "reports"))
    monkeypatch.setenv("HETSCHED_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("HETSCHED_STATE", str(tmp_path / "state.db"))
    (tmp_path / "profiles.csv").write_text(emulated_csv())
    return tmp_path


def _plan(tmp: Path, prefix: str, nodes: list[tuple[str, str, int]], iterations: int,
          jobs: str = JOBS) -> dict:
    from hetsched.cli.main import main

    (tmp / "jobs.yaml").write_text(jobs % {"p": prefix})
    import yaml

    (tmp / "cluster.yaml").write_text(yaml.safe_dump(cluster_yaml(nodes)))
    code, out = invoke(main, ["plan", str(tmp / "jobs.yaml"), "--cluster",
                              str(tmp / "cluster.yaml"), "--throughputs",
                              str(tmp / "profiles.csv"), "--mode", "pool", "--policy", "hare",
                              "--task-iterations", str(iterations), "--out",
                              str(tmp / "pool.json"), "--no-gantt"])
    assert code == 0, out
    return json.loads((tmp / "pool.json").read_text())


def _pool_jobs(client: CliSlurmClient, pid: str) -> list:
    return [j for j in client.jobs() if j.comment == f"hetsched-pool:{pid}"]


def _wait_finished(client: CliSlurmClient, pid: str, timeout: float) -> str:
    seen = {"s": ""}

    def done() -> bool:
        js = _pool_jobs(client, pid)
        seen["s"] = ",".join(sorted({j.state for j in js}))
        return bool(js) and all(j.finished for j in js)

    wait_for(done, timeout, f"pool job of plan {pid} to finish", every_s=1.0)
    return seen["s"]


def _status_json() -> dict:
    from hetsched.cli.main import main

    code, out = invoke(main, ["status", "--json"])
    assert code == 0, out
    return json.loads(out[out.index("{"):])


def _log_tail(tmp: Path) -> str:
    logs = sorted((tmp / "state.db.files" / "logs").glob("*.out"))
    return "\n".join(p.read_text()[-3000:] for p in logs)


def test_pool_plan_runs_every_task_and_meets_its_prediction(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None,
        pool_env: Path) -> None:
    from hetsched.cli.main import main

    tmp = pool_env
    plan = _plan(tmp, "pe", [("a100-1", "a100", 1), ("v100-1", "v100", 1)], 5)
    pid = plan["plan_id"]
    assert len(plan["tasks"]["gpus"]) == 2
    code, out = invoke(main, ["submit", str(tmp / "pool.json"), "-p", "gpu"])
    assert code == 0, out
    assert len({j.leader for j in _pool_jobs(client, pid)}) == 1
    state = _wait_finished(client, pid, 240)
    assert state == "COMPLETED", _log_tail(tmp)

    st = _status_json()
    pool = st["pool"]
    assert pool["plan_id"] == pid
    for j in pool["jobs"]:  # every job done, every task run, every round
        assert j["done"], j
        assert j["rounds_done"] == j["rounds"] == plan["tasks"]["jobs"][j["job"]]["rounds"]
        assert j["tasks_done"] == j["tasks"]
    assert sum(j["tasks_done"] for j in pool["jobs"]) == plan["tasks"]["total_tasks"]
    pred, meas = pool["predicted_weighted_jct_s"], pool["measured_weighted_jct_s"]
    assert pred == pytest.approx(plan["objective"]["weighted_jct_s"])
    assert meas == pytest.approx(pred, rel=0.10), (meas, pred, pool["jobs"])
    code, out = invoke(main, ["status"])
    assert code == 0 and f"pool plan {pid}" in out and out.count(": done (round ") == 3, out

    # the monitor (watch, replan; not the read-only status) folds the task records
    # into the profile history
    code, out = invoke(main, ["watch", "--cycles", "1", "--interval", "0.1"])
    assert code == 0, out
    from hetsched.state.store import open_store

    with open_store(None) as s:
        rows = {(r["workload"], r["gpu_type"], r["local_batch"]): r for r in s.profiles()}
    a, c = EMULATE_COST
    for (w, g, b), r in rows.items():
        assert w == "mlp"
        assert r["step_time_s"] == pytest.approx((a + c * b) / EMULATE_SPEED[g], rel=0.25)
    # at the batch a pass trained: several steps' slices of 16 (the plan's chunk: fused
    # passes), not one slice
    assert rows and max(b for _, _, b in rows) > 16, rows


def _executor_pids(pid: str) -> dict[int, int]:
    """SLURM_PROCID -> process id of this plan's executors (python processes running exec)."""
    out: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in (d / "environ").read_bytes().decode(
                errors="replace").split("\0") if "=" in kv)
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if env.get("HETSCHED_PLAN_ID") == pid and "hetsched.cli.main" in cmd \
                and "SLURM_PROCID" in env:
            out[int(env["SLURM_PROCID"])] = int(d.name)
    return out


def test_killed_executor_fails_the_job_and_replan_completes_the_rest(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None,
        pool_env: Path) -> None:
    from hetsched.cli.main import main
    from hetsched.io.plan_json import load_plan
    from hetsched.io.pool_reports import completed_rounds

    tmp = pool_env
    plan = _plan(tmp, "pk", [("a100-1", "a100", 1), ("v100-1", "v100", 1)], 1, SMALL_JOBS)
    pid = plan["plan_id"]
    code, out = invoke(main, ["submit", str(tmp / "pool.json"), "-p", "gpu"])
    assert code == 0, out
    typed = load_plan(tmp / "pool.json")
    rounds = {n: m["rounds"] for n, m in plan["tasks"]["jobs"].items()}

    def some_rounds_done() -> bool:
        done = completed_rounds(typed, tmp / "ckpt")
        return sum(done.values()) >= 3 and len(_executor_pids(pid)) == 2

    wait_for(some_rounds_done, 180, "a few checkpointed rounds", every_s=0.5)
    victim = _executor_pids(pid)[1]
    os.kill(victim, signal.SIGKILL)  # a process this test's job started
    state = _wait_finished(client, pid, 60)
    assert "FAILED" in state or "CANCELLED" in state, state
    before = completed_rounds(typed, tmp / "ckpt")
    assert 0 < sum(before.values()) < sum(rounds.values())
    log = _log_tail(tmp)
    assert "pool job failed" in log and "Traceback" not in log, log

    # the GPUs still up: a100-1 and v100-1 only (the rest drained for this test)
    others = [n.name for n in testbed.node_confs if n.name not in ("a100-1", "v100-1")]
    for n in others:
        client.runner.run(["scontrol", "update", f"nodename={n}", "state=drain",
                           "reason=pool-test"])
    time.sleep(1)
    n_jobs = len(client.jobs())
    code, out = invoke(main, ["replan", "--throughputs", str(tmp / "profiles.csv"), "-p", "gpu",
                              "--json", "--dry-run"])
    assert code == 0 and json.loads(out[out.index("{"):])["status"] == "dry-run", out
    assert len(client.jobs()) == n_jobs  # a dry run submits nothing
    code, out = invoke(main, ["replan", "--throughputs", str(tmp / "profiles.csv"), "-p", "gpu",
                              "--json"])
    assert code == 0, out
    res = json.loads(out[out.index("{"):])
    assert res["status"] == "replanned", res
    new_id = res["new_plan_id"]
    assert new_id and new_id != pid
    from hetsched.state.store import open_store

    with open_store(None) as s:
        new = s.plan(new_id)
    assert new is not None and new["mode"] == "pool" and new["replan_of"] == pid
    assert new["settings"] == plan["settings"]  # replanned the way the plan was made
    assert {g["node"] for g in new["tasks"]["gpus"]} <= {"a100-1", "v100-1"}
    for name, m in new["tasks"]["jobs"].items():  # only the rounds not checkpointed
        assert m["rounds"] == rounds[name]
        first = min(int(row[1]) for g in new["tasks"]["gpus"] for run in g["runs"]
                    for row in run["tasks"] if row[0] == name)
        assert first == before[name]
    assert set(new["tasks"]["jobs"]) == {n for n in rounds if before[n] < rounds[n]}
    state = _wait_finished(client, new_id, 240)
    assert state == "COMPLETED", _log_tail(tmp)
    typed_new = load_plan(tmp / "state.db.files" / "plans" / f"{new_id}.json")
    after = completed_rounds(typed_new, tmp / "ckpt")
    assert after == {n: rounds[n] for n in new["tasks"]["jobs"]}
    pool = _status_json()["pool"]
    assert pool["plan_id"] == new_id and all(j["done"] for j in pool["jobs"])


def test_node_failure_replans_on_the_gpus_still_up(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None,
        pool_env: Path) -> None:
    """A pool node goes down mid-run: NODE_FAIL, and replan uses only what is still up."""
    from hetsched.cli.main import main
    from hetsched.io.plan_json import load_plan
    from hetsched.io.pool_reports import completed_rounds

    tmp = pool_env
    plan = _plan(tmp, "pn", [("a100-1", "a100", 1), ("v100-1", "v100", 1)], 1, SMALL_JOBS)
    pid = plan["plan_id"]
    code, out = invoke(main, ["submit", str(tmp / "pool.json"), "-p", "gpu"])
    assert code == 0, out
    typed = load_plan(tmp / "pool.json")
    rounds = {n: m["rounds"] for n, m in plan["tasks"]["jobs"].items()}
    wait_for(lambda: sum(completed_rounds(typed, tmp / "ckpt").values()) >= 2, 180,
             "two checkpointed rounds", every_s=0.5)
    for n in testbed.node_confs:  # the pool's own nodes stay; the rest is not offered
        if n.name not in ("a100-1", "v100-1"):
            client.runner.run(["scontrol", "update", f"nodename={n.name}", "state=drain",
                               "reason=pool-test"])
    testbed.stop_node("v100-1")  # keep it down (ReturnToService=2 would revive it)
    client.runner.run(["scontrol", "update", "nodename=v100-1", "state=down",
                       "reason=pool-test"])
    state = _wait_finished(client, pid, 90)
    assert state != "COMPLETED", state
    code, out = invoke(main, ["replan", "--throughputs", str(tmp / "profiles.csv"), "-p", "gpu",
                              "--json"])
    assert code == 0, out
    res = json.loads(out[out.index("{"):])
    assert res["status"] == "replanned", res
    from hetsched.state.store import open_store

    with open_store(None) as s:
        new = s.plan(res["new_plan_id"])
    assert new is not None
    assert {g["node"] for g in new["tasks"]["gpus"]} == {"a100-1"}  # v100-1 is down
    state = _wait_finished(client, new["plan_id"], 240)
    assert state == "COMPLETED", _log_tail(tmp)
    after = completed_rounds(load_plan(tmp / "state.db.files" / "plans"
                                       / f"{new['plan_id']}.json"), tmp / "ckpt")
    assert after == {n: rounds[n] for n in new["tasks"]["jobs"]}
