"""An uneven task plan (pool mode's default, from the space plan) runs on the executor
as synchronous data-parallel training: each task trains its own local batch and the
round's step weights its gradient by its share, so the parameters equal single-process
training on each round's whole batch."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

pytestmark = pytest.mark.slow  # torch training in threads


def test_uneven_plan_equals_single_process(tmp_path: Path) -> None:
    import torch
    from exec_helpers import JOBS, make_plan, plan_json

    from hetsched.io.plan_json import load_plan
    from hetsched.runtime.executor.entry import run_threads
    from hetsched.runtime.executor.plan import exec_plan
    from hetsched.runtime.workloads import gather, load_workload

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
        wl = load_workload(str(job.spec.workload), dataset_size=job.dataset_size, seed=3)
        opt = wl.optimizer(wl.model.parameters())
        for r in range(job.rounds):
            parts = []
            for k in range(job.round_iterations(r)):
                step = job.round_step(r) + k
                off, n = job.step_samples(step)
                perm = np.random.default_rng([3, step // job.steps_per_epoch()]).permutation(
                    job.dataset_size)
                parts.append(perm[off:off + n])
            x, y = gather(wl.dataset, np.concatenate(parts))
            opt.zero_grad()
            wl.loss_fn(wl.model(x), y).backward()
            opt.step()
        ref = torch.cat([p.detach().reshape(-1) for p in wl.model.parameters()])
        got = torch.load(ck / xp.plan_id / f"{name}.pt", weights_only=True)["params"]
        assert float((got - ref).abs().max()) < 2e-5, name
