"""An uneven task plan (pool mode's default, from the space plan) runs on the executor
as synchronous data-parallel training: each task trains its own local batch and the
round's step weights its gradient by its share, so the parameters equal single-process
training on each round's whole batch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

pytestmark = pytest.mark.slow  # torch training in threads


def test_uneven_plan_equals_single_process(tmp_path: Path) -> None:
    import torch
    from exec_helpers import JOBS, make_plan, plan_json
    from test_executor_equivalence import reference

    from hetsched.io.plan_json import load_plan
    from hetsched.runtime.executor.entry import run_threads
    from hetsched.runtime.executor.plan import exec_plan

    jobs = JOBS.replace("workload: tiny-transformer", "workload: cnn")
    plan = make_plan(tmp_path, gpus=3, task_iterations=2, jobs=jobs, space="seed")
    d = plan_json(plan)
    assert d["tasks"]["columns"][-2:] == ["local_batch", "iterations"]
    xp = exec_plan(load_plan(plan))
    assert any(len(set(bs)) > 1 for j in xp.jobs.values() for _, bs in j.layout or ())
    ck = tmp_path / "ck"
    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "seed": 3})
    assert all(isinstance(r, dict) for r in res), res
    for name, job in xp.jobs.items():
        ref = reference(job, 3)  # one process, one step per round of its own samples
        got = torch.load(ck / xp.plan_id / f"{name}.pt", weights_only=True)["params"]
        assert float((got - ref).abs().max()) < 2e-5, name
