"""What sbatch gets from the caller's environment (hetsched/slurm/sbatch_env.py)."""

from __future__ import annotations

from hetsched.slurm.sbatch_env import sbatch_environment, script_options

SCRIPT = """#!/bin/bash
#SBATCH --job-name=j
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks=2
#SBATCH --cpus-per-task=1
#SBATCH --gres=gpu:2
#SBATCH --mem=4G
#SBATCH hetjob
#SBATCH --gres=gpu:1
#SBATCH --output=/logs/%x-%j.out
#SBATCH --requeue
# --time in a comment is not an option
srun hetsched run --time 3
"""


def test_script_options_are_the_sbatch_lines_of_every_component() -> None:
    assert script_options(SCRIPT) == {"job-name", "partition", "nodes", "ntasks",
                                      "cpus-per-task", "gres", "mem", "output", "requeue"}


def test_an_enclosing_jobs_variables_stay_out_and_the_users_inputs_stay_in() -> None:
    caller = {"PATH": "/usr/bin", "HOME": "/home/u", "SLURM_CONF": "/etc/slurm/slurm.conf",
              "SLURM_TIME_FORMAT": "relative", "SLURM_JOB_ID": "77", "SLURM_JOBID": "77",
              "SLURM_MEM_PER_CPU": "100", "SLURM_CPUS_PER_TASK": "4", "SLURM_NTASKS": "2",
              "SLURM_TRES_PER_TASK": "cpu:4", "SLURM_EXPORT_ENV": "NONE",
              "SLURMD_NODENAME": "n1", "HETSCHED_STATE": "/s"}
    env, left_out = sbatch_environment(caller, SCRIPT)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/u", "HETSCHED_STATE": "/s",
                   "SLURM_CONF": "/etc/slurm/slurm.conf", "SLURM_TIME_FORMAT": "relative"}
    assert left_out == {}  # nothing the user chose: nothing to tell


def test_sbatch_variables_that_would_override_the_script_are_left_out_and_named() -> None:
    caller = {"SBATCH_PARTITION": "debug", "SBATCH_OUTPUT": "/elsewhere/%j.out",
              "SBATCH_ERROR": "/elsewhere/%j.err", "SBATCH_MEM_PER_CPU": "1G",
              "SBATCH_GPUS": "4", "SBATCH_NO_REQUEUE": "1", "SBATCH_WAIT": "1",
              "SBATCH_ARRAY_INX": "0-3", "SBATCH_EXCLUSIVE": "1",
              # options the script leaves out: the user's choice applies
              "SBATCH_ACCOUNT": "proj", "SBATCH_RESERVATION": "r", "SBATCH_TIMELIMIT": "60"}
    env, left_out = sbatch_environment(caller, SCRIPT)
    assert env == {"SBATCH_ACCOUNT": "proj", "SBATCH_RESERVATION": "r",
                   "SBATCH_TIMELIMIT": "60"}
    assert set(left_out) == set(caller) - set(env)
    assert "--partition" in left_out["SBATCH_PARTITION"]
    assert "HETSCHED_PARTITION" in left_out["SBATCH_PARTITION"]
    assert "HETSCHED_SBATCH_MEM" in left_out["SBATCH_MEM_PER_CPU"]
    cpus_env, cpus_out = sbatch_environment({"SBATCH_CPUS_PER_GPU": "8"}, SCRIPT)
    assert cpus_env == {} and "HETSCHED_SBATCH_CPUS_PER_GPU" in cpus_out["SBATCH_CPUS_PER_GPU"]
    assert "--output" in left_out["SBATCH_ERROR"]
    assert "wait" in left_out["SBATCH_WAIT"]


def test_a_script_with_time_and_account_takes_them_from_hetscheds_settings() -> None:
    script = SCRIPT.replace("#SBATCH --mem=4G", "#SBATCH --time=90\n#SBATCH --account=a")
    env, left_out = sbatch_environment({"SBATCH_TIMELIMIT": "60", "SBATCH_ACCOUNT": "b",
                                        "SBATCH_MEM_PER_NODE": "8G"}, script)
    assert env == {"SBATCH_MEM_PER_NODE": "8G"}
    assert "HETSCHED_SBATCH_TIME" in left_out["SBATCH_TIMELIMIT"]
    assert "HETSCHED_SBATCH_ACCOUNT" in left_out["SBATCH_ACCOUNT"]


def test_gres_types_keep_slurms_spelling_beside_hetscheds_lower_case() -> None:
    from hetsched.slurm.client import NodeInfo, gres_names, parse_gres, type_names

    text = "gpu:Tesla_V100:2(S:0,1),gpu:A100:1(S:0),gpu:4,mps:100"
    assert parse_gres(text) == {"tesla_v100": 2, "a100": 1, "gpu": 4}
    assert gres_names(text) == {"tesla_v100": "Tesla_V100", "a100": "A100", "gpu": ""}
    nodes = [NodeInfo("n1", "idle", {}, {}, gres_names=gres_names("gpu:A100:2")),
             NodeInfo("n2", "idle", {}, {}, gres_names=gres_names("gpu:t4:1"))]
    assert type_names(nodes) == {"a100": "A100", "t4": "t4"}


def test_a_gres_request_spells_the_type_as_slurm_does() -> None:
    from hetsched.slurm.templates import gres_type

    names = {"a100": "A100", "gpu": ""}
    assert gres_type("a100", names) == "A100"
    assert gres_type("gpu", names) == "" and gres_type("gpu", None) == ""  # gpu:N
    assert gres_type("t4", names) == "t4" and gres_type("t4", None) == "t4"


def test_cpus_per_gpu_is_a_whole_number_of_cores() -> None:
    import pytest

    from hetsched.core.sbatch import SbatchOptionError, SbatchOptions

    assert SbatchOptions.parse({"cpus_per_gpu": 8}).cpus_per_gpu == 8
    assert SbatchOptions.parse({"cpus_per_gpu": "4"}).cpus_per_gpu == 4
    for bad in (0, -1, "2.5", "many", True, 5000):
        with pytest.raises(SbatchOptionError, match="whole number of CPU cores"):
            SbatchOptions.parse({"cpus_per_gpu": bad})
    base = SbatchOptions(cpus_per_gpu=2)
    assert SbatchOptions(mem="4G").over(base).cpus_per_gpu == 2
    assert SbatchOptions(cpus_per_gpu=6).over(base).cpus_per_gpu == 6
