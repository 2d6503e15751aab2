"""Launcher: reading Slurm's environment in one step across hetjob components, and more."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.errors import InputError
from hetsched.runtime.emulate import emulation_for, parse_speeds
from hetsched.runtime.job import load_plan_job
from hetsched.runtime.launcher import derive_port, from_env, local_batches_for

# what Slurm 22.05 sets for rank 2 of `srun --het-group=0,1` over a hetjob whose
# component 0 is one task on a100-1 and component 1 two tasks on v100-1 (recorded
# on the testbed)
HET_RANK2 = {
    "SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3", "SLURM_LOCALID": "1",
    "SLURMD_NODENAME": "v100-1", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0",
    "SLURM_HET_SIZE": "2", "SLURM_JOB_NODELIST_HET_GROUP_0": "a100-1",
    "SLURM_JOB_NODELIST_HET_GROUP_1": "v100-1", "SLURM_STEP_NODELIST": "a100-1,v100-1",
    "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "2",
    "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3", "SLURM_STEP_TASKS_PER_NODE": "1,2",
}


def test_hetjob_step_environment() -> None:
    r = from_env(HET_RANK2)
    assert (r.rank, r.world_size, r.local_rank, r.node) == (2, 3, 1, "v100-1")
    assert r.source == "slurm" and r.job_id == "1234"
    # a100-1 does not resolve here: the launch node (the batch host = component 0's node)
    assert r.master_addr == "10.1.2.3"
    assert r.master_port == derive_port("1234", "0")
    r0 = from_env({**HET_RANK2, "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                   "SLURMD_NODENAME": "a100-1"})
    assert (r0.master_addr, r0.master_port) == (r.master_addr, r.master_port)


def test_rank0_node_resolves_and_overrides() -> None:
    env = {**HET_RANK2, "SLURM_JOB_NODELIST_HET_GROUP_0": "localhost"}
    assert from_env(env).master_addr == "127.0.0.1"
    env = {**HET_RANK2, "HETSCHED_MASTER_ADDR": "10.9.9.9", "HETSCHED_MASTER_PORT": "40001"}
    r = from_env(env)
    assert (r.master_addr, r.master_port) == ("10.9.9.9", 40001)
    plain = {k: v for k, v in HET_RANK2.items() if "HET" not in k}
    plain["SLURM_STEP_NODELIST"] = "localhost,v100-1"
    assert from_env(plain).master_addr == "127.0.0.1"


def test_torchrun_style_and_single() -> None:
    r = from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (r.rank, r.world_size, r.master_addr, r.master_port, r.source) == (
        1, 2, "h", 1234, "env")
    s = from_env({})
    assert (s.rank, s.world_size, s.source) == (0, 1, "single")


def test_bad_environment_is_one_clear_error() -> None:
    with pytest.raises(InputError, match="SLURM_PROCID='x' is not an integer"):
        from_env({**HET_RANK2, "SLURM_PROCID": "x"})
    with pytest.raises(InputError, match="not below"):
        from_env({**HET_RANK2, "SLURM_PROCID": "3"})


def test_ports_differ_between_jobs() -> None:
    ports = {derive_port(str(j)) for j in range(1000, 1300)}
    assert len(ports) == 300 and all(30000 <= p < 32768 for p in ports)


def test_local_batches() -> None:
    assert local_batches_for(3, {"HETSCHED_LOCAL_BATCHES": "5,2,1"}) == [5, 2, 1]
    assert local_batches_for(2, {}, [3, 4]) == [3, 4]
    with pytest.raises(InputError, match="2 local batches for 3 ranks"):
        local_batches_for(3, {"HETSCHED_LOCAL_BATCHES": "5,2"})
    with pytest.raises(InputError, match="not a comma-separated"):
        local_batches_for(1, {"HETSCHED_LOCAL_BATCHES": "five"})


def test_emulation_parsing() -> None:
    assert parse_speeds("a100=2, v100=1") == {"a100": 2.0, "v100": 1.0}
    e = emulation_for("A100", {"HETSCHED_EMULATE_SPEED": "a100=2",
                               "HETSCHED_EMULATE_COST": "0.01,0.001"})
    assert e is not None and e.step_time(10) == pytest.approx(0.01)
    assert emulation_for("t4", {"HETSCHED_EMULATE_SPEED": "a100=2"}) is None
    with pytest.raises(InputError, match="TYPE=SPEED"):
        parse_speeds("a100:2")


def _plan(tmp: Path, spec: dict[str, object]) -> Path:
    workers = [{"node": "v100-1", "gpu_type": "v100", "gpu": 0, "local_batch": 2},
               {"node": "a100-1", "gpu_type": "a100", "gpu": 0, "local_batch": 5},
               {"node": "v100-1", "gpu_type": "v100", "gpu": 1, "local_batch": 1}]
    # a minimal plan that satisfies the plan contract (io/plan_json.py)
    full = {"workload": "mlp", "dataset_size": 64, "epochs": 1, "global_batch": 8, **spec}
    plan = {"version": 1, "policy": "test", "lower_bound": {"weighted_jct_s": 1.0},
            "jobs": [{"name": "j", "weight": 1.0, "arrival_s": 0.0, "spec": full,
                      "segments": [{"start_s": 0.0, "end_s": 1.0, "workers": workers}]}]}
    p = tmp / "plan.json"
    p.write_text(json.dumps(plan))
    return p


def test_rank_order_follows_the_hetjob_components(tmp_path: Path) -> None:
    _, ws = load_plan_job(str(_plan(tmp_path, {})), "j")
    assert [(w["gpu_type"], w["local_batch"]) for w in ws] == [("v100", 2), ("v100", 1),
                                                              ("a100", 5)]
    with pytest.raises(InputError, match="no job 'k'"):
        load_plan_job(str(tmp_path / "plan.json"), "k")


def test_command_mode_gets_its_local_batch_without_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = ("import json,os,sys; json.dump({k: os.environ.get(k) for k in ('RANK','WORLD_SIZE',"
            "'HETSCHED_LOCAL_BATCH','HETSCHED_GLOBAL_BATCH','MASTER_ADDR')} | {'argv': "
            "sys.argv[1:]}, open(sys.argv[1], 'w'))")
    plan = _plan(tmp_path, {"workload": "x", "global_batch": 8,
                            "command": [sys.executable, "-c", code, str(out), "$(touch pwned)"]})
    env = {**os.environ, **HET_RANK2, "SLURM_PROCID": "1", "HETSCHED_STATE": str(tmp_path / "s")}
    env.pop("HETSCHED_LOCAL_BATCHES", None)
    subprocess.run([sys.executable, "-c", "from hetsched.cli.main import main; main()", "run", "--plan", str(plan), "--job",
                    "j"], env=env, check=True, cwd=tmp_path, timeout=60)
    got = json.loads(out.read_text())
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "3"
    assert got["HETSCHED_LOCAL_BATCH"] == "1" and got["HETSCHED_GLOBAL_BATCH"] == "8"
    assert got["argv"] == [str(out), "$(touch pwned)"]
    assert not (tmp_path / "pwned").exists()


def test_cpu_threads_follow_slurm_and_openmp_caps() -> None:
    """Slurm's CPUs per task cap a rank's threads, and so does an explicit
    OMP_NUM_THREADS (Slurm 22.05 leaves SLURM_CPUS_PER_TASK unset in hetjob steps)."""
    import os

    from hetsched.runtime.launcher import cpu_threads

    cores = len(os.sched_getaffinity(0))
    assert cpu_threads(1, {}) == max(1, cores)
    assert cpu_threads(1, {"SLURM_CPUS_PER_TASK": "1"}) == 1
    assert cpu_threads(1, {"OMP_NUM_THREADS": "1"}) == 1
    assert cpu_threads(1, {"OMP_NUM_THREADS": "x"}) == max(1, cores)


def test_ranks_of_a_slurm_step_share_the_jobs_cpus_on_their_node(monkeypatch) -> None:
    """Under Slurm without per-task binding, a node's ranks split the job's CPUs there
    (SLURM_CPUS_ON_NODE) by the step's tasks on the node; a task bound to fewer cores
    keeps its own; explicit caps still win. The env is what the testbed's hetjob step
    showed (2 ranks on a100-1 and 1 on t4-1)."""
    import os

    from hetsched.runtime.launcher import cpu_threads, step_tasks_here

    step = {"SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "a100-1,t4-1"}
    a100 = {**step, "SLURMD_NODENAME": "a100-1", "SLURM_CPUS_ON_NODE": "8"}
    t4 = {**step, "SLURMD_NODENAME": "t4-1", "SLURM_CPUS_ON_NODE": "8"}
    assert step_tasks_here(a100) == 2 and step_tasks_here(t4) == 1
    assert step_tasks_here({**a100, "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                            "SLURM_STEP_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2"}) == 2
    assert step_tasks_here({**a100, "SLURMD_NODENAME": "elsewhere"}) is None
    assert step_tasks_here({}) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert cpu_threads(None, a100) == 4 and cpu_threads(None, t4) == 8
    assert cpu_threads(None, {**a100, "SLURM_CPUS_ON_NODE": "2"}) == 1
    assert cpu_threads(None, {**a100, "OMP_NUM_THREADS": "2"}) == 2
    assert cpu_threads(None, {}) == 16  # outside Slurm: the cores it may use
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(3)))
    assert cpu_threads(None, a100) == 3  # bound to 3 cores of its own
    # the testbed: every node claims 8 CPUs on a machine of 2, and a task may use both;
    # its node's ranks split the machine's cores (each taking both spun 4-9x slower)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    assert cpu_threads(None, a100) == 1 and cpu_threads(None, t4) == 2
    assert cpu_threads(None, {**a100, "SLURM_STEP_TASKS_PER_NODE": "4,1"}) == 1
