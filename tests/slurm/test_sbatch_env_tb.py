"""hetsched inside a Slurm job, and SBATCH_* in the caller's shell, on the real testbed.

A site that forbids long processes on its login nodes has users run `hetsched
watch` or `replan` as a job, and `submit` or `profile` from an interactive
allocation. sbatch copies the enclosing job's SLURM_* variables into every job
it submits, where srun reads them as its own options: with `sbatch_mem` set,
the enclosing job's SLURM_MEM_PER_CPU made each submitted job die at once
("srun: fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are
mutually exclusive"). And an SBATCH_OUTPUT in a login shell's profile sent the
job's log where `status` does not look.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm


def _step_stub(tmp_path: Path) -> Path:
    """A stand-in for `hetsched run` that records the step's environment and ends."""
    stub = tmp_path / "env-hetsched"
    stub.write_text(f"#!/bin/bash\nenv > {tmp_path}/env-$SLURM_JOB_ID-$SLURM_PROCID.txt\n")
    stub.chmod(0o755)
    return stub


def _plan(tmp_path: Path, plan_id: str, two_types: bool = False) -> Path:
    workers = [("v100-1", "v100", 8)] + ([("a100-1", "a100", 8)] if two_types else [])
    plan = contract_plan(plan_id, {"inner": [workers]})
    pf = tmp_path / "plan.json"
    pf.write_text(plan.to_json())
    return pf


def _hetsched() -> list[str]:
    return [sys.executable, "-c", "from hetsched.cli.main import main; main()"]


def _final_state(client: CliSlurmClient, job_id: str) -> str:
    def done() -> bool:
        return any(j.finished for j in client.jobs() if j.leader == job_id)

    wait_for(done, 60, f"Slurm job {job_id} to end", every_s=0.5)
    return next(j.state for j in client.jobs() if j.leader == job_id)


def _submitted(state: Path) -> dict[str, str]:
    from hetsched.state.store import open_store

    with open_store(state) as st:
        return {s.job: s.slurm_id for s in st.submissions()}


def test_submit_from_inside_a_slurm_job_gives_jobs_their_own_environment(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_EXECUTABLE", str(_step_stub(tmp_path)))
    monkeypatch.setenv("HETSCHED_SBATCH_MEM", "200M")
    state = tmp_path / "state.db"
    script = tmp_path / "driver.sh"
    cmd = " ".join(f"'{a}'" for a in [*_hetsched(), "submit", str(_plan(tmp_path, "inside1")),
                                      "--state", str(state)])
    script.write_text(f"#!/bin/bash\n{cmd}\necho \"submit exit $?\"\n")
    # the enclosing job: memory per CPU and two CPUs a task, as a user's allocation has
    out = subprocess.run(["sbatch", "--parsable", "--partition=gpu", "--nodelist=t4-1",
                          "--ntasks=1", "--cpus-per-task=2", "--mem-per-cpu=100",
                          f"--output={tmp_path}/driver.out", str(script)],
                         capture_output=True, text=True, check=True, env=os.environ)
    driver = out.stdout.strip().split(";")[0]
    assert _final_state(client, driver) == "COMPLETED"
    assert "submit exit 0" in (tmp_path / "driver.out").read_text()
    inner = _submitted(state)["inner"]
    assert inner != driver
    assert _final_state(client, inner) == "COMPLETED", \
        list((tmp_path / "state.db.files" / "logs").glob("*"))
    env = dict(line.split("=", 1) for line in
               (tmp_path / f"env-{inner}-0.txt").read_text().splitlines() if "=" in line)
    assert env["SLURM_JOB_ID"] == inner
    assert "SLURM_MEM_PER_CPU" not in env  # the enclosing job's
    # the script asks for no --cpus-per-task (the partition's default applies), and the
    # enclosing job's 2 did not leak in
    assert "SLURM_CPUS_PER_TASK" not in env


def test_sbatch_variables_in_the_shell_do_not_override_the_script(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSCHED_EXECUTABLE", str(_step_stub(tmp_path)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, SBATCH_OUTPUT=f"{elsewhere}/%j.out", SBATCH_PARTITION="nope",
               SBATCH_WAIT="1")
    state = tmp_path / "state.db"
    res = subprocess.run([*_hetsched(), "submit", str(_plan(tmp_path, "shellenv1")),
                          "--state", str(state)], capture_output=True, text=True, env=env,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    for var, option in (("SBATCH_OUTPUT", "--output"), ("SBATCH_PARTITION", "--partition"),
                        ("SBATCH_WAIT", "wait")):
        [line] = [ln for ln in res.stderr.splitlines() if var in ln]
        assert line.startswith("hetsched: warning:") and option in line
    inner = _submitted(state)["inner"]
    assert _final_state(client, inner) == "COMPLETED"
    assert list((tmp_path / "state.db.files" / "logs").glob(f"*-{inner}.out"))
    assert not list(elsewhere.iterdir())


def test_cpus_per_gpu_reach_each_rank(testbed: Testbed, client: CliSlurmClient,
                                      clean_queue: None, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank got one CPU core, whatever the job needed (--cpus-per-task was fixed at 1
    and reserved): data loading on a real GPU node starved. `cpus_per_gpu` sets it."""
    monkeypatch.setenv("HETSCHED_EXECUTABLE", str(_step_stub(tmp_path)))
    state = tmp_path / "state.db"
    # two components (a hetjob across a V100 and an A100 node): each rank asks for 2 cores
    res = subprocess.run([*_hetsched(), "submit", str(_plan(tmp_path, "cpus1", True)),
                          "--state", str(state), "--cpus-per-gpu", "2"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    inner = _submitted(state)["inner"]
    assert _final_state(client, inner) == "COMPLETED"
    [script] = (tmp_path / "state.db.files" / "scripts").rglob("inner-0.sh")
    text = script.read_text()
    # the step asks too: srun of 22.05 does not take the job's --cpus-per-task
    assert text.count("#SBATCH --cpus-per-task=2") == 2 and text.count(
        " --cpus-per-task=2 ") == 2, text
    for rank in (0, 1):
        env = dict(line.split("=", 1) for line in (tmp_path / f"env-{inner}-{rank}.txt")
                   .read_text().splitlines() if "=" in line)
        assert env["SLURM_CPUS_PER_TASK"] == "2"
    # an extra option cannot set it behind hetsched's back, and says which key does
    res = subprocess.run([*_hetsched(), "submit", str(_plan(tmp_path, "cpus2")), "--state",
                          str(state), "--sbatch-option=--cpus-per-task=4"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "use the 'cpus_per_gpu' key" in res.stderr, res.stderr


@pytest.fixture()
def def_cpu_per_gpu_2(testbed: Testbed, client: CliSlurmClient,
                      clean_queue: None) -> Iterator[str]:
    """A partition (in slurm.conf, as a site sets it) giving each GPU 2 CPU cores unless a
    job says otherwise. (`scontrol update ... JobDefaults=` took effect on a fresh
    slurmctld only, not after the nodes' slurmd restarted: a test of Slurm's, not ours.)"""
    original = testbed.conf.read_text()
    testbed.conf.write_text(original + "PartitionName=cores2 Nodes=v100-1 DefCpuPerGPU=2 "
                            "MaxTime=INFINITE State=UP\n")
    client.runner.run(["scontrol", "reconfigure"])
    wait_for(lambda: "cores2" in client.runner.run(["sinfo", "-h", "-o", "%P"]).stdout, 20,
             "partition cores2")
    try:
        yield "cores2"
    finally:
        testbed.conf.write_text(original)
        client.runner.run(["scontrol", "reconfigure"])


def _num_cpus(client: CliSlurmClient, job_id: str) -> list[int]:
    """Each component's NumCPUs, as Slurm allocated them."""
    out = client.runner.run(["scontrol", "show", "job", job_id]).stdout
    return [int(x) for x in re.findall(r"NumCPUs=(\d+)", out)]


def test_the_partitions_cores_per_gpu_apply_unless_cpus_per_gpu_is_set(
        def_cpu_per_gpu_2: str, client: CliSlurmClient, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """hetsched wrote --cpus-per-task=1 into every job, overriding a site's DefCpuPerGPU:
    a GPU job got one core where the site gives eight. Unset, the site's default applies."""
    stub = tmp_path / "sleep-hetsched"
    stub.write_text("#!/bin/bash\nsleep 30\n")
    stub.chmod(0o755)
    monkeypatch.setenv("HETSCHED_EXECUTABLE", str(stub))
    state = tmp_path / "state.db"
    got = {}
    for pid, extra in (("dcpg1", []), ("dcpg2", ["--cpus-per-gpu", "3"])):
        plan = contract_plan(pid, {pid: [[("v100-1", "v100", 8), ("v100-1", "v100", 8)]]})
        pf = tmp_path / f"{pid}.json"
        pf.write_text(plan.to_json())
        res = subprocess.run([*_hetsched(), "submit", str(pf), "--state", str(state),
                              "--partition", def_cpu_per_gpu_2, *extra],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        jid = _submitted(state)[pid]
        wait_for(lambda j=jid: any(i.state == "RUNNING" for i in client.jobs()
                                   if i.leader == j), 60, f"job {jid} to start", every_s=0.5)
        got[pid] = _num_cpus(client, jid)
        client.cancel([jid])
    assert got == {"dcpg1": [4], "dcpg2": [6]}  # 2 GPUs x the partition's 2; x 3
