"""The switch mechanism on CPU: layer-by-layer loading through forward hooks, state that
survives eviction and return, zeroed device copies, and the plan's keep/evict decisions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from exec_helpers import make_plan

from hetsched.io.plan_json import load_plan
from hetsched.planning.pool.memory import plan_gpu_memory
from hetsched.runtime.executor.entry import run_threads
from hetsched.runtime.executor.plan import exec_plan
from hetsched.runtime.executor.slots import JobSlot
from hetsched.runtime.workloads import load_workload


def _slot(workload: str) -> tuple[JobSlot, torch.nn.Module, torch.Tensor]:
    """A slot whose host buffer holds a reference model's weights, and that model."""
    ref = load_workload(workload, dataset_size=16, seed=1)
    other = load_workload(workload, dataset_size=16, seed=2)  # different initial weights
    slot = JobSlot(other.model, torch.device("cpu"))
    slot.host.copy_(torch.cat([p.detach().reshape(-1) for p in ref.model.parameters()]))
    x = ref.dataset[:4][0]  # type: ignore[index]
    return slot, ref.model, x


def test_layers_load_one_by_one_as_forward_reaches_them() -> None:
    slot, ref, x = _slot("mlp")
    slot.load(0)
    assert len(slot.layers) == 3 and len(slot.pending) == 2  # first layer eagerly, 2 waiting
    last = slot.layers[-1][1][0]
    assert not torch.equal(slot.dev[last], slot.host_views[last])  # not copied yet
    out = slot.model(x)
    slot.check_loaded()
    assert not slot.pending
    assert torch.equal(out, ref(x))


def test_attention_weights_read_outside_forward_still_load() -> None:
    # MultiheadAttention reads out_proj.weight without calling out_proj: one opaque layer
    slot, ref, x = _slot("tiny-transformer")
    slot.load(0)
    out = slot.model(x)
    slot.check_loaded()
    assert torch.allclose(out, ref(x), atol=1e-6)


def test_state_survives_eviction_and_return_and_eviction_zeroes() -> None:
    slot, ref, x = _slot("cnn")
    slot.load(0)
    first = slot.model(x).detach()
    dev = [d for d in slot.dev if d is not None]
    assert dev and all(d.abs().sum() > 0 for d in dev)
    slot.evict()
    assert not slot.resident and all(d is None for d in slot.dev)
    assert all(float(d.abs().sum()) == 0.0 for d in dev)  # what the job left is zeroed
    host_before = slot.host.clone()
    slot.load(1)
    assert torch.equal(slot.host, host_before)
    assert torch.equal(slot.model(x).detach(), first)
    # a resident but stale copy is refreshed in place: no new device tensors
    ptrs = [d.data_ptr() for d in slot.dev if d is not None]
    slot.host.mul_(0.5)
    slot.load(2)
    assert [d.data_ptr() for d in slot.dev if d is not None] == ptrs
    assert not torch.equal(slot.model(x).detach(), first)


def _run(tmp: Path, mem_gb: float, residency: bool) -> tuple[Any, list[dict[str, Any]]]:
    plan = make_plan(tmp, gpus=2, task_iterations=1, mem_gb=mem_gb)
    seen: list[dict[str, Any]] = []
    res = run_threads(str(plan), {"seed": 0, "residency": residency, "on_task": seen.append})
    assert all(isinstance(r, dict) for r in res), res
    return exec_plan(load_plan(plan)), seen


def test_speculative_keep_and_evict_decisions_are_followed(tmp_path: Path) -> None:
    # 2 GB GPUs, 1 GB models: the next task's model plus one more fit, not all three
    xp, seen = _run(tmp_path, 2.0, True)
    names = list(xp.jobs)
    mem = [xp.jobs[n].memory_gb for n in names]
    evictions = 0
    for gid, gpu in xp.gpus.items():
        mine = [r for r in seen if r["gpu"] == gid]
        assert [(r["job"], r["round"], r["task"]) for r in mine] == [
            (t.job, t.round, t.task) for t in gpu.tasks]
        mp = plan_gpu_memory([names.index(t.job) for t in gpu.tasks], mem, gpu.memory_gb)
        assert [r["warm"] for r in mine] == mp.warm
        resident: set[str] = set()
        for t, r in zip(gpu.tasks, mine, strict=True):  # the plan's residency, task by task
            resident.add(t.job)
            if not t.keep:
                resident.discard(t.job)
            resident -= set(t.evict)
            evictions += (not t.keep) + len(t.evict)
            assert set(r["resident"]) == resident, (gid, t, r["resident"])
    assert evictions > 0  # the instance really exercises eviction
    warm = [r for r in seen if r["warm"]]
    assert warm and any(r["bytes_in"] == 0 for r in warm)  # same round again: nothing moved
    assert all(r["bytes_in"] > 0 for r in seen if not r["warm"])


def test_without_residency_every_task_loads(tmp_path: Path) -> None:
    _, seen = _run(tmp_path, 2.0, False)
    assert not any(r["warm"] for r in seen)
    assert all(r["bytes_in"] > 0 and r["resident"] == [] for r in seen)
