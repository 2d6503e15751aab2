"""Pool execution is synchronous data parallel training: three jobs whose tasks are
interleaved on two executors (and back to back on one) end with the parameters of
single-process training on each round's whole batch; plain averaging of unequal
slices does not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from exec_helpers import JOBS, make_plan, plan_json

from hetsched.runtime.executor.entry import run_local, run_threads
from hetsched.runtime.executor.plan import ExecJob, exec_plan
from hetsched.runtime.workloads import gather, load_workload

pytestmark = pytest.mark.slow  # multi-process torch: `make test`, not `make test-fast`

SEED = 3
#: all three with SGD: Adam (the tiny transformer's optimizer) turns the float noise of a
#: gradient that is zero in exact arithmetic (attention's key bias) into lr-sized steps
SGD_JOBS = JOBS.replace("workload: tiny-transformer", "workload: cnn")


def reference(job: ExecJob, seed: int) -> torch.Tensor:
    """One process, one optimizer step per round on all of the round's samples."""
    wl = load_workload(str(job.spec.workload), dataset_size=job.dataset_size, seed=seed)
    opt = wl.optimizer(wl.model.parameters())
    for r in range(job.rounds):
        parts = []
        for k in range(job.round_iterations(r)):
            step = job.round_step(r) + k  # r * iterations in equal rounds
            off, n = job.step_samples(step)
            perm = np.random.default_rng([seed, step // job.steps_per_epoch()]).permutation(
                job.dataset_size)
            parts.append(perm[off:off + n])
        x, y = gather(wl.dataset, np.concatenate(parts))
        opt.zero_grad()
        wl.loss_fn(wl.model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in wl.model.parameters()])


def final_params(ck: Path, plan_id: str, job: str) -> torch.Tensor:
    state: dict[str, Any] = torch.load(ck / plan_id / f"{job}.pt", weights_only=True)
    return state["params"]


def check(plan: Path, ck: Path) -> dict[str, float]:
    """Max abs difference per job between the pool run and the reference."""
    from hetsched.io.plan_json import load_plan

    xp = exec_plan(load_plan(plan))
    return {name: float((final_params(ck, xp.plan_id, name) - reference(j, SEED)).abs().max())
            for name, j in xp.jobs.items()}


def test_interleaved_on_two_executors_equals_single_process(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=2, jobs=SGD_JOBS)
    tasks = plan_json(plan)["tasks"]
    seqs = [[r[0] for run in g["runs"] for _ in range(run["repeat"]) for r in run["tasks"]]
            for g in tasks["gpus"]]
    assert len(seqs) == 2 and all(len(set(s)) >= 2 for s in seqs), seqs  # really interleaved
    assert {j["tasks_per_round"] for j in tasks["jobs"].values()} >= {2, 3}
    # the tasks train two steps' slices a pass (the plan's chunk: 16 samples, slices of
    # 3-4), so the same gradient must come of fewer, larger passes
    from hetsched.io.plan_json import load_plan

    xp = exec_plan(load_plan(plan))
    assert all(j.chunk for j in xp.jobs.values())
    assert all(len(g) == 2 for j in xp.jobs.values() for g in j.passes(0, 0, "v100"))
    ck = tmp_path / "ck"
    codes = run_local(str(plan), {"checkpoint_dir": str(ck), "report_dir": str(tmp_path / "r"),
                                  "device": "cpu", "seed": SEED, "threads": 1})
    assert codes == [0, 0]
    diffs = check(plan, ck)
    assert max(diffs.values()) < 2e-5, diffs


@pytest.mark.parametrize("gpus", [1, 3])
def test_back_to_back_and_wider_pools_equal_single_process(tmp_path: Path, gpus: int) -> None:
    plan = make_plan(tmp_path, gpus=gpus, task_iterations=1, jobs=SGD_JOBS)
    ck = tmp_path / "ck"
    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "seed": SEED})
    assert all(isinstance(r, dict) for r in res), res
    diffs = check(plan, ck)
    assert max(diffs.values()) < 2e-5, diffs


def test_plain_averaging_of_unequal_slices_fails(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=2, jobs=SGD_JOBS)
    ck = tmp_path / "ck"
    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "seed": SEED, "average": True})
    assert all(isinstance(r, dict) for r in res), res
    diffs = check(plan, ck)
    # unequal slices (a: 10 over 3 tasks = 4,3,3; c: 7 over 2 = 4,3) are biased ...
    assert diffs["a"] > 1e-3 and diffs["c"] > 1e-3, diffs
    # ... while b's equal slices (8 over 2, no partial batch) average correctly
    assert diffs["b"] < 2e-5, diffs
