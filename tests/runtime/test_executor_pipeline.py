"""Parameters and gradients off the critical path: the executor pulls the next task's
parameters before the current task computes and pushes gradients from another thread,
with results identical to the in-line executor, and reports its per-task overhead."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from exec_helpers import make_plan  # noqa: E402

from hetsched.io.plan_json import load_plan  # noqa: E402
from hetsched.io.reports import iter_records  # noqa: E402
from hetsched.runtime.executor import worker  # noqa: E402
from hetsched.runtime.executor.entry import run_threads  # noqa: E402
from hetsched.runtime.executor.state import checkpoint_path  # noqa: E402


def _params(ck: Path, plan_id: str, jobs: list[str]) -> dict[str, Any]:
    return {j: torch.load(checkpoint_path(ck, plan_id, j), weights_only=True)["params"]
            for j in jobs}


def test_pull_ahead_push_behind_same_result(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=1)
    p = load_plan(plan)
    jobs = [j.name for j in p.jobs]
    events: list[tuple[str, str, Any]] = []
    lock = threading.Lock()
    orig_pull, orig_compute, orig_call = (worker.Executor._pull, worker.Executor._compute,
                                          worker.Executor._call)

    def log(ex: worker.Executor, what: str, key: Any) -> None:
        with lock:
            events.append((ex.gpu.id, what, key))

    def pull(self: worker.Executor, t: Any, *a: Any) -> Any:
        log(self, "pull", (t.job, t.round, t.task))
        return orig_pull(self, t, *a)

    def compute(self: worker.Executor, t: Any, *a: Any) -> Any:
        log(self, "compute", (t.job, t.round, t.task))
        return orig_compute(self, t, *a)

    def call(self: worker.Executor, head: dict[str, Any], *a: Any, **k: Any) -> Any:
        if head.get("op") == "put":
            log(self, "put-thread", threading.current_thread().name)
        return orig_call(self, head, *a, **k)

    monkeypatch.setattr(worker.Executor, "_pull", pull)
    monkeypatch.setattr(worker.Executor, "_compute", compute)
    monkeypatch.setattr(worker.Executor, "_call", call)
    ck, rep = tmp_path / "ck", tmp_path / "rep"
    res = run_threads(str(plan), {"seed": 0, "checkpoint_dir": str(ck),
                                  "report_dir": str(rep)})
    assert all(isinstance(r, dict) for r in res), res
    for gpu in {e[0] for e in events}:
        seq = [(w, k) for g, w, k in events if g == gpu and w in ("pull", "compute")]
        computes = [k for w, k in seq if w == "compute"]
        assert len(computes) >= 2
        for n in range(len(computes) - 1):  # task n+1's pull was issued before task n computed
            i_pull = seq.index(("pull", computes[n + 1]))
            i_comp = seq.index(("compute", computes[n]))
            assert i_pull < i_comp, (gpu, computes[n], seq)
        puts = [k for g, w, k in events if g == gpu and w == "put-thread"]
        assert puts and all(name.startswith("push-") for name in puts)
    piped = _params(ck, str(p.plan_id), jobs)

    monkeypatch.undo()
    ck2 = tmp_path / "ck2"
    res = run_threads(str(plan), {"seed": 0, "checkpoint_dir": str(ck2), "in_line": True})
    assert all(isinstance(r, dict) for r in res), res
    inline = _params(ck2, str(p.plan_id), jobs)
    for j in jobs:  # the same contributions (a round's may arrive in another order)
        assert torch.allclose(piped[j], inline[j], rtol=0, atol=1e-6), j

    files = sorted((rep / str(p.plan_id)).glob("gpu-*.jsonl"))
    assert len(files) == 2
    for f in files:
        tasks = list(iter_records(f, "task"))
        summ = list(iter_records(f, "executor"))
        assert tasks and all(t["overhead_s"] >= 0 and "sync_s" in t for t in tasks)
        assert len(summ) == 1 and summ[0]["pipelined"] is True
        s = summ[0]
        assert s["tasks"] == len(tasks)
        assert s["compute_s"] == pytest.approx(sum(t["compute_s"] for t in tasks), abs=1e-3)
        assert s["overhead_s"] == pytest.approx(sum(t["overhead_s"] for t in tasks), abs=1e-3)
        assert s["wall_s"] >= s["compute_s"]
