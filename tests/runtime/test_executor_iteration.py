"""The pool planner can be given the step a pool task runs: ``iteration_time`` times the
executor's own iteration (the same function its tasks call), which has no optimizer step."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hetsched.runtime import workloads  # noqa: E402
from hetsched.runtime.executor import iteration  # noqa: E402


def test_iteration_time_runs_the_executors_iteration_without_an_optimizer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    built: list[Any] = []
    orig_it, orig_load = iteration.iteration, workloads.load_workload

    def counted(model: Any, loss_fn: Any, data: Any, idx: Any, dev: Any, scale: float) -> None:
        calls.append(len(idx))
        orig_it(model, loss_fn, data, idx, dev, scale)

    def load(*a: Any, **k: Any) -> Any:
        wl = orig_load(*a, **k)
        start = [p.detach().clone() for p in wl.model.parameters()]
        built.append((wl, start))
        return dataclasses.replace(wl, optimizer=lambda params: built.append("optimizer"))

    monkeypatch.setattr(iteration, "iteration", counted)
    monkeypatch.setattr(workloads, "load_workload", load)
    sec = iteration.iteration_time("mlp", 8, "cpu", steps=3, warmup=1)
    assert calls == [8] * 4 and sec > 0
    assert "optimizer" not in built
    (wl, start), = built
    # the host copy the executor keeps is untouched (nothing stepped the parameters)
    assert all(torch.equal(p.detach(), s) for p, s in zip(wl.model.parameters(), start, strict=True))
