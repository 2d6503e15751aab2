"""Every template, every field, every hostile value: refused, or inert.

A value reaches a script only through a filter (templates.py). This test
renders each template in ``job_templates/`` with a hostile value in each
field in turn. The render either refuses the value (``TemplateValueError``:
the user sees one line) or produces a script that

* parses (``bash -n``),
* keeps its shape: the ``#SBATCH`` directives are those of the clean render,
  so no value can end a comment or inject a directive,
* runs (with ``srun`` replaced by a recorder) without executing anything a
  value carried: no marker file appears.

The testbed test then submits the accepted renders to a real Slurm and checks
the same on the nodes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slurm_helpers import job_plan, wait_for

from hetsched.core.groups import GroupMember, GroupView
from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import GpuTasks, PoolTasks, TaskRow, TaskRun
from hetsched.core.sbatch import SbatchOptions
from hetsched.core.spec import GPU
from hetsched.errors import InputError
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.group_script import render_group
from hetsched.slurm.pool_script import render_pool
from hetsched.slurm.templates import (
    Script,
    render_hetjob,
    render_probe,
    templates_dir,
)
from hetsched.slurm.testbed import Testbed


def hostile(marker: Path) -> list[str]:
    """Values that would run ``touch MARKERn`` if any reached the shell unquoted."""
    m = str(marker)
    return [
        f"x\ntouch {m}1 #",                 # ends a comment line
        f"$(touch {m}2)",                    # command substitution
        f"`touch {m}3`",                     # backticks
        f"'; touch {m}4; '",                 # single-quote break-out
        f'"; touch {m}5; "',                 # double-quote break-out
        f"x\n#SBATCH --wrap=touch {m}6",      # directive injection
        f"a b; touch {m}7",                  # word splitting + separator
        f"x\r\ntouch {m}8",                  # carriage return
    ]


def _hetjob_job(**over: Any) -> dict[str, Any]:
    w = {"node": over.pop("node", "a100-1"), "gpu_type": over.pop("gpu_type", "a100"),
         "gpu": 0, "local_batch": 8}
    spec = {"workload": over.pop("workload", "resnet-18"), "global_batch": 8}
    if "command" in over:
        spec["command"] = [over.pop("command")]
    if "entrypoint" in over:
        spec["entrypoint"] = over.pop("entrypoint")
    return {"name": over.pop("name", "hj"), "spec": spec,
            "segments": [{"start_s": 0, "end_s": 1, "workers": [w]}]}


SBATCH_FIELDS = ("time", "account", "qos", "mem", "constraint", "extra")


def _render_hetjob(tmp: Path, stub: str, **field: Any) -> Script:
    plan_id = field.pop("plan_id", "p1")
    kw = {k: field.pop(k) for k in ("plan_path", "log_dir", "partition", "layout_path")
          if k in field}
    # sbatch options straight into the dataclass: the template's own filter must hold
    opts = {k: field.pop(k) for k in SBATCH_FIELDS if k in field}
    if "extra" in opts:
        opts["extra"] = ("--exclusive", opts["extra"])
    sbatch = SbatchOptions(**opts)
    job = _hetjob_job(**field)
    return render_hetjob(plan_id, job_plan(job), plan_path=kw.get("plan_path", tmp / "plan.json"),
                         log_dir=kw.get("log_dir", tmp), partition=kw.get("partition", "gpu"),
                         hetsched=field.get("hetsched", stub), sbatch=sbatch, time_min=5,
                         signal_s=60, layout_path=kw.get("layout_path", tmp / "l.json"))


def _render_probe(tmp: Path, stub: str, **field: Any) -> Script:
    return render_probe(field.get("workload", "resnet-18"), field.get("gpu_type", "t4"), [8],
                        out=field.get("out", tmp / "o.csv"), log_dir=field.get("log_dir", tmp),
                        partition=field.get("partition", "gpu"), node=field.get("node", "t4-1"),
                        extra_args=[field["extra_arg"]] if "extra_arg" in field else (),
                        hetsched=field.get("hetsched", stub), time_min=2)


def _render_pool(tmp: Path, stub: str, **field: Any) -> Script:
    """A pool plan built straight from values (no validation: the template's own defence)."""
    gpus = [GpuTasks(field.get("node", "a100-1"), 0, field.get("gpu_type", "a100"),
                     (TaskRun((TaskRow("pj", 0, 0, 0.0, 1.0, 1.0),), 2, 1.0, 1),), 2),
            GpuTasks("t4-1", 1, "t4", (), 1)]
    plan = Plan("hare", [job_plan(_hetjob_job(name="pj"))], 1.0,
                mode="pool", tasks=PoolTasks({}, gpus))
    opts = {k: field[k] for k in SBATCH_FIELDS if k in field}
    if "extra" in opts:
        opts["extra"] = ("--exclusive", opts["extra"])
    return render_pool(plan, field.get("plan_id", "p1"),
                       plan_path=field.get("plan_path", tmp / "plan.json"),
                       log_dir=field.get("log_dir", tmp),
                       report_dir=field.get("report_dir", tmp / "reports"),
                       checkpoint_dir=field.get("checkpoint_dir", tmp / "ckpt"),
                       partition=field.get("partition", "gpu"),
                       hetsched=field.get("hetsched", stub), sbatch=SbatchOptions(**opts),
                       time_min=5)


def _render_group(tmp: Path, stub: str, **field: Any) -> Script:
    """A co-location group built straight from values (no validation: the template's own
    defence)."""
    node, gpu_type = field.get("node", "a100-1"), field.get("gpu_type", "a100")
    view = GroupView(field.get("group", "g1"), (GPU(node, gpu_type, 0), GPU(node, gpu_type, 1)),
                     (GroupMember("ga", 0, (4, 4)), GroupMember("gb", 0, (2, 6))), 0.0, 60.0)
    opts = {k: field[k] for k in SBATCH_FIELDS if k in field}
    if "extra" in opts:
        opts["extra"] = ("--exclusive", opts["extra"])
    return render_group(field.get("plan_id", "p1"), view,
                        plan_path=field.get("plan_path", tmp / "plan.json"),
                        log_dir=field.get("log_dir", tmp),
                        partition=field.get("partition", "gpu"),
                        hetsched=field.get("hetsched", stub), sbatch=SbatchOptions(**opts),
                        time_min=5, signal_s=60, memory_mb=1024)


# template -> (renderer, fields a user or a plan can set)
TEMPLATES: dict[str, tuple[Callable[..., Script], tuple[str, ...]]] = {
    "hetjob.sbatch.j2": (_render_hetjob, (
        "plan_id", "name", "workload", "command", "entrypoint", "node", "gpu_type",
        "partition", "log_dir", "plan_path", "layout_path", "hetsched", *SBATCH_FIELDS)),
    "probe.sbatch.j2": (_render_probe, (
        "workload", "gpu_type", "node", "partition", "log_dir", "out", "extra_arg",
        "hetsched")),
    "pool.sbatch.j2": (_render_pool, (
        "plan_id", "node", "gpu_type", "partition", "log_dir", "plan_path",
        "report_dir", "checkpoint_dir", "hetsched", *SBATCH_FIELDS)),  # no job names here
    "group.sbatch.j2": (_render_group, (
        "plan_id", "group", "node", "gpu_type", "partition", "log_dir", "plan_path",
        "hetsched", *SBATCH_FIELDS)),  # job names reach the runtime through the plan only
}


def test_every_template_is_covered() -> None:
    """A new template must join TEMPLATES (and so this test) before it can ship."""
    shipped = {p.name for p in templates_dir().glob("*.j2")}
    assert shipped <= set(TEMPLATES), f"templates without a hostile-value test: " \
        f"{sorted(shipped - set(TEMPLATES))}"


def _directives(text: str) -> list[str]:
    return [ln.split("=", 1)[0] for ln in text.splitlines() if ln.startswith("#SBATCH")]


def _run_with_recorder(script: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run the script with ``srun`` replaced by a recorder of its argv."""
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    srun = bindir / "srun"
    srun.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$(dirname "$0")/srun.args"\n')
    srun.chmod(0o755)
    path = tmp / "job.sh"
    path.write_text(script)
    # what a Slurm batch shell has (the step's task counts come from the allocation)
    slurm = {"SLURM_TASKS_PER_NODE": "1",
             **{f"SLURM_TASKS_PER_NODE_HET_GROUP_{k}": "1" for k in range(4)}}
    env = {**os.environ, **slurm, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=30)


def accepted_renders(tmp: Path, stub: str) -> list[tuple[str, str, str, Script]]:
    """(template, field, value, script) for every hostile value the renderer accepted."""
    out = []
    for name, (render, fields) in TEMPLATES.items():
        clean = render(tmp, stub)
        for field in fields:
            for value in hostile(tmp / f"m-{name[:3]}-{field}-"):
                try:
                    s = render(tmp, stub, **{field: value})
                except InputError as e:  # TemplateValueError, or Job refusing a bad name
                    assert "\n" not in str(e)  # one line for the user
                    continue
                assert _directives(s.text) == _directives(clean.text), (name, field, value)
                out.append((name, field, value, s))
    return out


@pytest.mark.slow
def test_hostile_values_are_refused_or_inert(tmp_path: Path) -> None:
    stub = str(tmp_path / "no-such-hetsched")
    renders = accepted_renders(tmp_path, stub)
    # values that are quoted arguments are accepted (and must be inert) ...
    fields = {(n, f) for n, f, _, _ in renders}
    assert ("hetjob.sbatch.j2", "command") in fields
    assert ("probe.sbatch.j2", "extra_arg") in fields
    assert ("pool.sbatch.j2", "report_dir") in fields
    assert ("group.sbatch.j2", "plan_path") in fields
    # ... nothing with a line break is ever accepted
    assert not any("\n" in v or "\r" in v for _, _, v, _ in renders)
    for name, field, value, s in renders:
        subprocess.run(["bash", "-n"], input=s.text, text=True, check=True)
        run = _run_with_recorder(s.text, tmp_path)
        assert run.returncode == 0, (name, field, value, run.stderr)
        args = (tmp_path / "bin" / "srun.args").read_text().splitlines()
        # the hostile value arrives as one intact argument (or inside the env), never split
        if field in ("extra_arg", "hetsched", "plan_path", "layout_path", "out", "report_dir",
                     "checkpoint_dir"):
            assert value in args, (name, field, value, args)
    assert not list(tmp_path.glob("m-*")), "a hostile value executed"


@pytest.mark.slurm
def test_hostile_renders_submit_inert_on_slurm(
        testbed: Testbed, client: CliSlurmClient, clean_queue: None, tmp_path: Path) -> None:
    """The accepted hostile scripts run on a real Slurm: nothing they carry executes."""
    stub = tmp_path / "fake-hetsched"
    stub.write_text("#!/bin/bash\necho \"args=$* gres=$CUDA_VISIBLE_DEVICES\"\n")
    stub.chmod(0o755)
    ids = []
    for name, field, _value, s in accepted_renders(tmp_path, str(stub)):
        if field == "hetsched":
            continue  # an executable path that does not exist: the step fails, harmlessly
        path = tmp_path / f"{name[:3]}-{field}-{len(ids)}.sh"
        path.write_text(s.text)
        ids.append(client.submit(path))
    assert ids
    wait_for(lambda: all(j.finished for i in ids for j in client.job_detail(i)), 90,
             "hostile jobs to finish")
    assert not list(tmp_path.glob("m-*")), "a hostile value executed on a node"
