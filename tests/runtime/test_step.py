"""The probe times the step the job runs: both call the same TrainStep, fed the same way.

No timings here (speed is bench/bench_probe_vs_run.py's): these tests fail when
the probe (or the trainer) goes back to a loop of its own, i.e. when the step a
profile row times is no longer the one ``hetsched run`` executes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hetsched.runtime import step as step_mod  # noqa: E402
from hetsched.runtime.launcher import RankEnv  # noqa: E402
from hetsched.runtime.step import Feeder, TrainStep, build_step  # noqa: E402
from hetsched.runtime.workloads import BUILTINS, gather, load_workload  # noqa: E402


class Counter:
    """Wraps TrainStep.__call__ and the model forwards of every step object made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[TrainStep] = []
        self.calls = 0
        self.forwards = 0
        self.in_step = False
        self.models: set[int] = set()
        orig_call, orig_init = TrainStep.__call__, TrainStep.__init__
        me = self

        def init(self_: TrainStep, *a: Any, **k: Any) -> None:
            orig_init(self_, *a, **k)
            me.steps.append(self_)
            if id(self_.model) not in me.models:
                self_.model.register_forward_hook(me._fwd)
                me.models.add(id(self_.model))

        def call(self_: TrainStep, *a: Any, **k: Any) -> Any:
            me.calls += 1
            me.in_step = True
            try:
                return orig_call(self_, *a, **k)
            finally:
                me.in_step = False

        monkeypatch.setattr(TrainStep, "__init__", init)
        monkeypatch.setattr(TrainStep, "__call__", call)

    def _fwd(self, *_: Any) -> None:
        self.forwards += 1
        assert self.in_step, "a forward pass outside the job's step function"


def _one_rank(tmp: Path, workload: str, batch: int, steps: int) -> Any:
    from hetsched.runtime.trainer import TrainConfig, _train

    cfg = TrainConfig(job="j", workload=workload, dataset_size=batch * steps, epochs=1,
                      local_batches=[batch], report=str(tmp / "r.jsonl"), checkpoint=None,
                      device="cpu", report_every=3)
    renv = RankEnv(0, 1, 0, "localhost", "127.0.0.1", 0, "", "single")
    return _train(cfg, renv, torch.device("cpu"))


@pytest.mark.parametrize("workload", ["mlp", "cnn"])
def test_probe_and_run_call_the_same_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          workload: str) -> None:
    from hetsched.runtime.probe import probe

    c = Counter(monkeypatch)
    res = probe(workload, "cpu", [4, 8], warmup=2, steps=3, device="cpu", sync=False,
                min_time_s=0.0)
    assert {r.local_batch for r in res.rows} == {4, 8}
    # every probe step (warm-up and timed) is one call of the job's step, nothing else runs
    assert c.calls == 2 * (2 + 3) == c.forwards
    feeders = {id(s.feeder): s.feeder for s in c.steps}  # one, kept across the sweep
    assert sum(f.gathers for f in feeders.values()) == c.calls  # fed as the job is fed
    assert all(s.calls == 5 for s in c.steps)
    probe_kind = {type(s.hdp).__name__ for s in c.steps}

    c2 = Counter(monkeypatch)
    out = _one_rank(tmp_path, workload, 8, 7)
    assert out["steps"] == 7 and c2.calls == 7 == c2.forwards
    assert {type(s.hdp).__name__ for s in c2.steps} == probe_kind  # the same reduction
    done = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()
            if '"done"' in x][0]
    # the run's steady state starts after the probe's warm-up count
    assert done["warmup_steps"] == step_mod.WARMUP_STEPS and done["steady_step_s"] > 0
    assert done["start_to_first_step_s"] is None or done["start_to_first_step_s"] > 0
    assert done["first_loss"] is not None and done["last_loss"] is not None


def test_feeder_gives_the_sampler_batch() -> None:
    wl = load_workload("cnn", dataset_size=64)
    f = Feeder(wl.dataset, torch.device("cpu"))
    idx = np.array([5, 1, 63, 5])
    x, y = f.get(idx)
    gx, gy = gather(wl.dataset, idx)
    assert torch.equal(x, gx) and torch.equal(y, gy) and f.gathers == 1
    f.prefetch(np.array([0, 1]))  # nothing to overlap on CPU; the next get is still right
    x2, _ = f.get(np.array([2, 3]))
    assert torch.equal(x2, gather(wl.dataset, [2, 3])[0])


def test_step_keeps_the_loss_on_the_device() -> None:
    """The loss is read when asked (a report, an epoch's end), not every step."""
    wl = load_workload("mlp", dataset_size=64)
    st = build_step(wl, torch.device("cpu"))
    for k in range(3):
        st(np.arange(8 * k, 8 * k + 8), 8, counts=[8])
    assert isinstance(st.last_loss, torch.Tensor) and not st.last_loss.requires_grad
    first, last = st.losses()
    assert first is not None and last is not None and first != last


@pytest.mark.parametrize("workload", sorted(set(BUILTINS) - {"tiny-transformer"}))
def test_step_equals_the_plain_training_step(workload: str) -> None:
    """One TrainStep is one plain zero_grad/forward/backward/step on the same batch."""
    if workload in ("resnet50", "bert-base"):
        pytest.skip("large models: covered by the executor's tests")
    a, b = load_workload(workload, dataset_size=32), load_workload(workload, dataset_size=32)
    st = build_step(a, torch.device("cpu"))
    idx = np.arange(4, 20)
    st(idx, len(idx), counts=[len(idx)])
    opt = b.optimizer(b.model.parameters())
    x, y = gather(b.dataset, idx)
    opt.zero_grad()
    b.loss_fn(b.model(x), y).backward()
    opt.step()
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


@pytest.mark.slow
def test_run_process_does_not_import_what_it_does_not_use(tmp_path: Path) -> None:
    """A training rank (and the probe's and executor's modules) reach their steps without
    scipy, pulp, pydantic or matplotlib."""
    code = (
        "import sys\n"
        "from hetsched.runtime.trainer import TrainConfig, _train\n"
        "import hetsched.runtime.probe, hetsched.runtime.executor.worker\n"
        "from hetsched.runtime.launcher import RankEnv\n"
        "import torch\n"
        f"cfg = TrainConfig(job='j', workload='mlp', dataset_size=16, epochs=1,"
        f" local_batches=[8], report={str(tmp_path / 'r.jsonl')!r}, device='cpu')\n"
        "_train(cfg, RankEnv(0, 1, 0, 'h', '127.0.0.1', 0, '', 'single'), torch.device('cpu'))\n"
        "bad = sorted(m for m in ('scipy', 'pulp', 'pydantic', 'highspy', 'matplotlib')"
        " if m in sys.modules)\n"
        "print('imported:' + ','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.strip().splitlines()
    assert out[-1] == "imported:", f"a training rank {out[-1]}"


def test_probe_times_a_fast_step_for_long_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two steps of a 4-sample MLP last well under 50 ms: the probe times again, as many
    steps as fill ``min_time_s`` (again when a cold block's pace asked for too few), and
    keeps the mean of the last block, which lasts ``min_time_s`` at least."""
    from hetsched.runtime import probe as probe_mod

    c = Counter(monkeypatch)
    res = probe_mod.probe("mlp", "cpu", [4], warmup=1, steps=2, device="cpu", sync=False,
                          min_time_s=0.05)
    again = c.calls - 1 - 2  # the steps timed after the short block
    assert again > 2
    # the kept block: its steps at the kept mean last min_time_s (the loop stops there)
    assert res.rows[0].step_time_s * again >= 0.05


def test_probe_times_again_until_a_block_fills_min_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold first block (ten times slower than the steady state) would ask for a tenth of
    the steps ``min_time_s`` needs: the probe times again until one block fills it."""
    from hetsched.runtime import probe as probe_mod

    clock = {"t": 0.0, "steps": 0}
    pace = [0.01, 0.01, 0.001]  # the first two steps cold, then the steady state

    def fake_perf() -> float:
        return clock["t"]

    orig_call = TrainStep.__call__

    def call(self_: TrainStep, *a: Any, **k: Any) -> Any:
        out = orig_call(self_, *a, **k)
        if clock["steps"] >= 1:  # after the warm-up step
            i = clock["steps"] - 1
            clock["t"] += pace[min(i, len(pace) - 1)]
        clock["steps"] += 1
        return out

    monkeypatch.setattr(TrainStep, "__call__", call)
    # the probe module's own clock only (the process's time module stays real)
    monkeypatch.setattr(probe_mod, "time", types.SimpleNamespace(perf_counter=fake_perf))
    res = probe_mod.probe("mlp", "cpu", [4], warmup=1, steps=2, device="cpu", sync=False,
                          min_time_s=0.05)
    # short block: 2 steps, 20 ms -> asks for 5 steps, 5 ms at the steady pace -> again
    assert res.rows[0].step_time_s == pytest.approx(0.001)
    assert clock["steps"] - 1 - 2 - 5 >= 50  # the last block filled 50 ms at 1 ms a step
