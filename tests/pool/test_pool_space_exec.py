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


#: two jobs pinned to two of three GPUs: in the space plan one waits while a GPU idles
PINNED = """jobs:
  - {name: a, workload: mlp, dataset_size: 120, epochs: 1, global_batch: 10, min_gpus: 2,
     max_gpus: 2, memory_gb: 1}
  - {name: b, workload: cnn, dataset_size: 48, epochs: 1, global_batch: 8, min_gpus: 2,
     max_gpus: 2, memory_gb: 1}
"""


def test_reinserted_plan_equals_single_process(tmp_path: Path) -> None:
    """A job re-placed into the idle GPU runs a round's tasks back to back on one GPU
    (uneven rows); the executor still trains each round's whole batch in one step."""
    import torch
    from exec_helpers import make_plan, plan_json
    from test_executor_equivalence import reference

    from hetsched.io.plan_json import load_plan
    from hetsched.planning.pool.compact import expand_runs
    from hetsched.runtime.executor.entry import run_threads
    from hetsched.runtime.executor.plan import exec_plan

    plan = make_plan(tmp_path, gpus=3, task_iterations=1, jobs=PINNED, space="seed")
    d = plan_json(plan)
    assert d["params"]["order"] == "space" and d["params"]["reinserted_jobs"] >= 1
    loaded = load_plan(plan)
    assert loaded.tasks is not None
    per_gpu = {}
    for g in loaded.tasks.gpus:
        for r in expand_runs(list(g.runs)):
            per_gpu.setdefault((r.job, r.round, g.node), []).append(r.task)
    assert any(len(ts) > 1 for ts in per_gpu.values())  # two tasks of a round on one GPU
    xp = exec_plan(loaded)
    ck = tmp_path / "ck"
    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "seed": 3})
    assert all(isinstance(r, dict) for r in res), res
    for name, job in xp.jobs.items():
        ref = reference(job, 3)
        got = torch.load(ck / xp.plan_id / f"{name}.pt", weights_only=True)["params"]
        assert float((got - ref).abs().max()) < 2e-5, name
