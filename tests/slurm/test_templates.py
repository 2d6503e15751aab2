"""sbatch templates: nothing from a plan can inject shell code; the hetjob runs for real."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from slurm_helpers import job_plan, wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.templates import TemplateValueError, environment, render_hetjob, render_probe
from hetsched.slurm.testbed import Testbed

EVIL = "; rm -rf / $(x) `y`"


def _job(name: str = "tj", command: list[str] | None = None,
         workers: list[dict] | None = None) -> dict:
    return {
        "name": name,
        "spec": {"workload": "resnet-18", "global_batch": 40,
                 "command": command or ["python", "train.py"]},
        "segments": [{"start_s": 0, "end_s": 10, "workers": workers or [
            {"node": "a100-1", "gpu_type": "a100", "gpu": 0, "local_batch": 16},
            {"node": "a100-1", "gpu_type": "a100", "gpu": 1, "local_batch": 16},
            {"node": "t4-1", "gpu_type": "t4", "gpu": 0, "local_batch": 8}]}],
    }


def _render(job: dict, tmp_path: Path, **kw: object):
    kw.setdefault("layout_path", tmp_path / "tj-0.layout.json")
    return render_hetjob("p1", job_plan(job), plan_path=tmp_path / "plan.json", log_dir=tmp_path,
                         partition="gpu", **kw)  # type: ignore[arg-type]


def test_bad_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TemplateValueError, match="not a valid name"):
        _render(_job(name="x" + EVIL), tmp_path)
    bad_node = [{"node": "a100-1;id", "gpu_type": "a100", "gpu": 0, "local_batch": 8}]
    with pytest.raises(TemplateValueError):
        _render(_job(workers=bad_node), tmp_path)
    bad_type = [{"node": "a100-1", "gpu_type": "a100 --wrap=id", "gpu": 0, "local_batch": 8}]
    with pytest.raises(TemplateValueError):
        _render(_job(workers=bad_type), tmp_path)
    with pytest.raises(TemplateValueError, match="spaces or shell"):
        render_hetjob("p1", job_plan(_job()), plan_path="/x", log_dir="/tmp/a b", partition="gpu")


def test_unfiltered_value_cannot_reach_a_script(tmp_path: Path) -> None:
    (tmp_path / "bad.j2").write_text("echo {{ value }}\n")
    with pytest.raises(TemplateValueError, match="without a"):
        environment(tmp_path).get_template("bad.j2").render(value="$(id)")


def test_command_is_quoted(tmp_path: Path) -> None:
    s = _render(_job(command=["python", "train.py", EVIL]), tmp_path)
    line = next(x for x in s.text.splitlines() if x.startswith("export HETSCHED_COMMAND="))
    out = subprocess.run(["bash", "-c", line + '\nprintf %s "$HETSCHED_COMMAND"'],
                         capture_output=True, text=True, check=True).stdout
    assert shlex.split(out) == ["python", "train.py", EVIL]  # round-trips exactly
    subprocess.run(["bash", "-n"], input=s.text, text=True, check=True)
    assert [c.gpu_type for c in s.components] == ["a100", "t4"]
    # the rank layout is read at start from the layout file, never baked in
    assert "HETSCHED_LOCAL_BATCHES" not in s.text and "16,16,8" not in s.text
    assert f"--layout {tmp_path}/tj-0.layout.json" in s.text
    assert s.text.count("#SBATCH hetjob") == 1
    # pinned: untyped GPUs on the node, so a replan can move it to another type's node
    assert "--gres=gpu:2\n#SBATCH --nodelist=a100-1" in s.text
    assert "--gres=gpu:1\n#SBATCH --nodelist=t4-1" in s.text
    loose = _render(_job(), tmp_path, pin_nodes=False)
    assert "--gres=gpu:a100:2" in loose.text and "--nodelist" not in loose.text
    # without one, the layout file is submit's: FILES/layouts/PLAN/JOB-SEG.json
    plain = render_hetjob("p1", job_plan(_job()), plan_path=tmp_path / "plans" / "p1.json",
                          log_dir=tmp_path)
    assert f"--layout {tmp_path}/layouts/p1/tj-0.json" in plain.text
    p = render_probe("resnet 18;id", "t4", [8, 16], out=tmp_path / "o.csv", log_dir=tmp_path)
    assert "--workload 'resnet 18;id'" in p.text
    subprocess.run(["bash", "-n"], input=p.text, text=True, check=True)


@pytest.mark.slurm
def test_hetjob_runs_with_local_batches_and_no_injection(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"; touch {marker} $(touch {marker}2) `touch {marker}3`"
    stub = tmp_path / "fake-hetsched"
    stub.write_text("#!/bin/bash\n"
                    'echo "rank=$SLURM_PROCID node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES '
                    'tasks=$SLURM_STEP_NUM_TASKS args=$*"\n'
                    'printf "cmd=%s\\n" "$HETSCHED_COMMAND"\n')
    stub.chmod(0o755)
    s = _render(_job(command=["python", "train.py", evil]), tmp_path, hetsched=str(stub))
    script = tmp_path / "job.sh"
    script.write_text(s.text)
    jid = client.submit(script)
    wait_for(lambda: all(j.state == "COMPLETED" for j in client.job_detail(jid))
             and client.job_detail(jid), 30, "hetjob to complete")
    out = (tmp_path / f"tj-{jid}.out").read_text()
    ranks = sorted(line for line in out.splitlines() if line.startswith("rank="))
    assert len(ranks) == 3
    assert ranks[0].startswith("rank=0 node=a100-1")
    assert ranks[2].startswith("rank=2 node=t4-1")
    assert "gpus=0,1 tasks=3 args=run --plan" in ranks[0]  # 2 a100 + 1 t4 task
    assert ranks[0].endswith(f"--layout {tmp_path}/tj-0.layout.json")
    assert f"cmd=python train.py '{evil}'" in out
    assert not any(Path(f"{marker}{s}").exists() for s in ("", "2", "3"))
