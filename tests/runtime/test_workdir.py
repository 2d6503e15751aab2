"""A job's workdir: where its command and its entrypoint's module are found.

A jobs file's jobs that run user code default to the file's own directory; a
relative `workdir` is taken from there. `hetsched run` and `hetsched probe`
enter it, so a step started anywhere (cron's home directory, "/") finds
`train.py` and `mytrain.py` beside jobs.yaml. The testbed runs the same
through Slurm (tests/slurm/test_workdir_tb.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.core.spec import Job
from hetsched.errors import InputError
from hetsched.io.plan_json import load_plan
from hetsched.io.specs import load_jobs, parse_jobs

MODULE = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

def build(dataset_size, seed):
    x = torch.randn(dataset_size, 8)
    y = (x.sum(1) > 0).long()
    return {"model": nn.Linear(8, 2), "dataset": TensorDataset(x, y),
            "loss_fn": nn.functional.cross_entropy,
            "optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
"""
COMMAND = "import os, sys\nopen(sys.argv[1], 'a').write(os.getcwd() + '\\n')\n"


def _jobs(tmp_path: Path, extra: str = "") -> Path:
    f = tmp_path / "proj" / "jobs.yaml"
    f.parent.mkdir(exist_ok=True)
    f.write_text(f"""jobs:
  - {{name: ep, workload: ownwl, entrypoint: "mytrain:build", dataset_size: 64, epochs: 1,
     global_batch: 16}}
  - {{name: cmd, workload: cmdwl, command: [{sys.executable!r}, train_cmd.py, out.txt],
     dataset_size: 64, epochs: 1, global_batch: 16}}
  - {{name: builtin, workload: mlp, dataset_size: 64, epochs: 1, global_batch: 16}}
{extra}""")
    return f


def test_user_code_runs_in_the_jobs_file_directory(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")
    jobs = {j.name: j for j in load_jobs(_jobs(tmp_path))}
    here = str(tmp_path / "proj")
    assert jobs["ep"].workdir == here and jobs["cmd"].workdir == here
    assert jobs["builtin"].workdir is None  # nothing of the user's to find
    assert jobs["ep"].to_dict()["workdir"] == here


@pytest.mark.parametrize("given, want", [
    ("src", "{proj}/src"), ("../other", "{tmp}/other"), ("/abs/dir", "/abs/dir"),
    ("~/code", "{home}/code")])
def test_a_relative_workdir_is_the_jobs_files(tmp_path: Path, given: str, want: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    f = _jobs(tmp_path, f"  - {{name: w, workload: mlp, dataset_size: 64, epochs: 1, "
                        f"global_batch: 16, workdir: {given!r}}}\n")
    [w] = [j for j in load_jobs(f) if j.name == "w"]
    assert w.workdir == want.format(proj=tmp_path / "proj", tmp=tmp_path,
                                    home=tmp_path / "home")


def test_workdir_refusals(tmp_path: Path) -> None:
    doc = {"jobs": [{"name": "a", "workload": "mlp", "dataset_size": 64, "epochs": 1,
                     "global_batch": 16, "workdir": "rel"}]}
    with pytest.raises(InputError, match=r"job 'a': workdir: 'rel' is relative and these "
                       "jobs come from no file"):
        parse_jobs(doc, "jobs")
    doc["jobs"][0]["workdir"] = "/a\nb"
    with pytest.raises(InputError, match="workdir: contains a control character"):
        parse_jobs(doc, "jobs")
    with pytest.raises(InputError, match="workdir: 'rel' is not an absolute path"):
        Job("a", "mlp", 64, 1, 16, workdir="rel")
    # jobs given as data (the API's dicts) run where the step starts, as before
    del doc["jobs"][0]["workdir"]
    doc["jobs"][0]["entrypoint"] = "m:f"
    assert parse_jobs(doc, "jobs")[0].workdir is None


def _plan(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    _jobs(tmp_path)
    (proj / "mytrain.py").write_text(MODULE)
    (proj / "train_cmd.py").write_text(COMMAND)
    (tmp_path / "cl.yaml").write_text("name: t\nnodes:\n  - {name: n1, gpu_type: cpu, "
                                      "gpus: 1}\n")
    (tmp_path / "tp.csv").write_text("workload,gpu_type,local_batch,step_time_s\n"
                                     "ownwl,cpu,16,0.01\ncmdwl,cpu,16,0.01\n"
                                     "mlp,cpu,16,0.01\n")
    plan = tmp_path / "plan.json"
    _cli(["plan", str(proj / "jobs.yaml"), "--cluster", str(tmp_path / "cl.yaml"),
          "--throughputs", str(tmp_path / "tp.csv"), "--out", str(plan)], tmp_path)
    return plan


def _cli(args: list[str], tmp_path: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "state.db")}
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-m", "hetsched", *args], cwd="/", env=env,
                       capture_output=True, text=True, timeout=300)
    assert (r.returncode == 0) == ok, r.stderr
    assert "Traceback" not in r.stderr
    return r


def test_run_enters_the_workdir_from_anywhere(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    plan = _plan(tmp_path)
    assert {j.name: j.spec.workdir for j in load_plan(plan).jobs if j.spec} == {
        "ep": str(tmp_path / "proj"), "cmd": str(tmp_path / "proj"), "builtin": None}
    _cli(["run", "--plan", str(plan), "--job", "ep", "--local"], tmp_path)
    [report] = (tmp_path / "state.db.files" / "reports").glob("*/ep.jsonl")
    assert "done" in [json.loads(x)["kind"] for x in report.read_text().splitlines()]
    # a command: one rank, exec'd in the workdir (no Slurm step: rank 0 of 1)
    env_step = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
    env = {**os.environ, **env_step, "HETSCHED_STATE": str(tmp_path / "state.db")}
    r = subprocess.run([sys.executable, "-m", "hetsched", "run", "--plan", str(plan),
                        "--job", "cmd"], cwd="/", env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "proj" / "out.txt").read_text() == f"{tmp_path / 'proj'}\n"


def test_a_workdir_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    plan = _plan(tmp_path)
    (tmp_path / "proj").rename(tmp_path / "moved")
    r = _cli(["run", "--plan", str(plan), "--job", "ep", "--local"], tmp_path, ok=False)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"hetsched: error: job 'ep': cannot enter the workdir "
                                f"'{tmp_path / 'proj'}': No such file or directory; it must "
                                "be a directory the job's nodes can reach")


def test_probe_imports_from_its_workdir(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "mytrain.py").write_text(MODULE)
    out = tmp_path / "p.csv"
    args = ["probe", "--workload", "ownwl", "--gpu-type", "cpu", "--entrypoint",
            "mytrain:build", "--batches", "4,8", "--out", str(out), "--no-sync"]
    r = _cli(args, tmp_path, ok=False)  # from "/", with no workdir: not found, and why
    assert "cannot import 'mytrain' from the Python path" in r.stderr
    assert "put it in the job's workdir" in r.stderr
    _cli([*args, "--workdir", str(proj)], tmp_path)
    assert out.read_text().startswith("workload,gpu_type,local_batch")


def test_profile_passes_the_workdir_to_the_probe_quoted(tmp_path: Path) -> None:
    from hetsched.app.profile import plan_probes, render_probes

    proj = tmp_path / "a $(touch pwned) dir"
    proj.mkdir()
    f = proj / "jobs.yaml"
    f.write_text("jobs:\n  - {name: ep, workload: ownwl, entrypoint: 'mytrain:build', "
                 "dataset_size: 64, epochs: 1, global_batch: 16}\n")
    specs, _ = plan_probes(load_jobs(f), ["a100"], None)
    assert [s.workdir for s in specs] == [str(proj)]
    [out] = render_probes(specs, tmp_path / "files", partition=None, time_limit_s=10,
                          warmup=1, steps=1)
    assert out.script is not None
    script = out.script.read_text()
    assert f"--workdir '{proj}'" in script
    subprocess.run(["bash", "-n", str(out.script)], check=True)


def test_run_local_execs_a_command_job_per_rank(tmp_path: Path) -> None:
    """`run --local` of a command job ran the trainer, which refused the job's workload
    ("give the job an entrypoint or a command"): each rank now execs the command."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train_cmd.py").write_text(
        "import os, sys\nopen(f\"rank{os.environ['RANK']}.txt\", 'w').write("
        "f\"{os.environ['WORLD_SIZE']} {os.environ['HETSCHED_LOCAL_BATCH']} "
        "{os.environ['HETSCHED_LOCAL_BATCHES']}\")\n")
    (proj / "jobs.yaml").write_text(
        f"jobs:\n  - {{name: cmd2, workload: cmdwl, command: [{sys.executable!r}, "
        "train_cmd.py], dataset_size: 64, epochs: 1, global_batch: 24, min_gpus: 2, "
        "max_gpus: 2}\n")
    (tmp_path / "cl.yaml").write_text("name: t\nnodes:\n  - {name: n1, gpu_type: cpu, "
                                      "gpus: 2}\n")
    (tmp_path / "tp.csv").write_text("workload,gpu_type,local_batch,step_time_s\n"
                                     "cmdwl,cpu,12,0.01\ncmdwl,cpu,24,0.02\n")
    plan = tmp_path / "plan.json"
    _cli(["plan", str(proj / "jobs.yaml"), "--cluster", str(tmp_path / "cl.yaml"),
          "--throughputs", str(tmp_path / "tp.csv"), "--out", str(plan)], tmp_path)
    r = _cli(["run", "--plan", str(plan), "--job", "cmd2", "--local"], tmp_path)
    assert json.loads(r.stderr.strip().splitlines()[-1]) == {"ranks": 2, "exit_codes": [0, 0]}
    assert sorted(p.read_text() for p in proj.glob("rank*.txt")) == ["2 12 12,12"] * 2


def test_two_workdirs_with_one_module_name_in_one_process_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool executor or a co-location group imports every job's entrypoint in one
    process: a second job's `wdclash.py` in another workdir silently got the first job's
    module (its model) until the import was checked against the job's own workdir."""
    pytest.importorskip("torch")
    from hetsched.runtime.workloads import load_workload

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "wdclash", raising=False)
    for name, width in (("a", 4), ("b", 6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "wdclash.py").write_text(MODULE.replace("nn.Linear(8, 2)",
                                                                   f"nn.Linear({width}, 2)"))
    try:
        first = load_workload("a", entrypoint="wdclash:build", dataset_size=8,
                              workdir=str(tmp_path / "a"))
        again = load_workload("a", entrypoint="wdclash:build", dataset_size=8,
                              workdir=str(tmp_path / "a"))
        assert first.model.in_features == again.model.in_features == 4  # type: ignore[union-attr]
        with pytest.raises(InputError, match=r"module 'wdclash' of .*b is already loaded in "
                           r"this process from .*a/wdclash.py; jobs that share a process"):
            load_workload("b", entrypoint="wdclash:build", dataset_size=8,
                          workdir=str(tmp_path / "b"))
    finally:
        sys.modules.pop("wdclash", None)
