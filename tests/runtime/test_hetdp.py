"""Heterogeneous data parallel on real processes (gloo, CPU): equivalence and resume.

One spawn of two ranks (shares 5/3) runs: share-weighted training to the end,
plain-DDP-averaged training to the end, and share-weighted training killed
after 3 steps (checkpoint). A second spawn of three ranks (shares 3/3/2, a
different split of the same global batch) resumes that checkpoint. Each
result is compared with one process training on the global batch of 8.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rt_helpers import train_many  # noqa: E402

from hetsched.runtime.launcher import RankEnv, spawn_local  # noqa: E402
from hetsched.runtime.trainer import TrainConfig, train  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

# 60 samples / global batch 8: 7 full steps + one partial step of 4 (split by shares)
DATA = 60


def _cfg(tmp: Path, name: str, batches: list[int], **kw: object) -> TrainConfig:
    return TrainConfig(job=name, workload="mlp", dataset_size=DATA, epochs=1.0,
                       local_batches=batches, save_params=str(tmp / f"{name}.params"),
                       report=str(tmp / f"{name}.jsonl"), device="cpu", **kw)  # type: ignore[arg-type]


def _load(p: Path) -> dict[str, torch.Tensor]:
    return torch.load(p, weights_only=True)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_shares_equal_one_process_and_resume_on_other_split(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    ref = _cfg(tmp_path, "ref", [8])
    train(ref, RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    weighted = _cfg(tmp_path, "weighted", [5, 3])
    averaged = _cfg(tmp_path, "averaged", [5, 3], average=True)
    first = _cfg(tmp_path, "resumed", [5, 3], max_steps=3, checkpoint=str(tmp_path / "c.pt"),
                 checkpoint_every=2)
    # SIGTERM to one rank only (what scancel / a requeue does): both stop at the same
    # step and rank 0 checkpoints it; emulated 50 ms steps make 100 steps take 5 s
    signalled = TrainConfig(job="sig", workload="mlp", dataset_size=800, epochs=1.0,
                            local_batches=[4, 4], gpu_types=["x", "x"], device="cpu",
                            checkpoint=str(tmp_path / "sig.pt"), checkpoint_every=1000,
                            report=str(tmp_path / "sig.jsonl"))
    codes = spawn_local(2, train_many, ([weighted, averaged, first, signalled], (1, 0.8)),
                        extra_env={"OMP_NUM_THREADS": "1", "HETSCHED_EMULATE_SPEED": "x=1",
                                   "HETSCHED_EMULATE_COST": "0.05,0.0001"}, timeout_s=120)
    assert codes == [0, 0]
    from hetsched.io.reports import iter_records

    stop = list(iter_records(tmp_path / "sig.jsonl", "stopped"))
    assert len(stop) == 1 and stop[0]["reason"] == "signal" and 0 < stop[0]["steps"] < 100
    assert torch.load(tmp_path / "sig.pt", weights_only=False)["step"] == stop[0]["steps"]
    last = {r["rank"]: r["step"] for r in iter_records(tmp_path / "sig.jsonl", "steps")}
    assert last == {0: stop[0]["steps"], 1: stop[0]["steps"]}  # the same step on both ranks
    ckpt = torch.load(tmp_path / "c.pt", weights_only=False)
    assert ckpt["step"] == 3 and ckpt["sampler"]["offset"] == 24
    second = _cfg(tmp_path, "resumed", [3, 3, 2], checkpoint=str(tmp_path / "c.pt"))
    codes = spawn_local(3, train_many, ([second],), extra_env={"OMP_NUM_THREADS": "1"},
                        timeout_s=120)
    assert codes == [0, 0, 0]

    r = _load(tmp_path / "ref.params")
    assert _max_diff(_load(tmp_path / "weighted.params"), r) < 1e-5
    assert _max_diff(_load(tmp_path / "resumed.params"), r) < 1e-5
    # plain averaging weights the 3-sample rank like the 5-sample one: a different model
    assert _max_diff(_load(tmp_path / "averaged.params"), r) > 1e-3

    done = list(iter_records(tmp_path / "resumed.jsonl", "done"))
    assert [d["steps"] for d in done] == [8] and done[0]["local_batches"] == [3, 3, 2]
    steps = list(iter_records(tmp_path / "weighted.jsonl", "steps"))
    assert {s["rank"] for s in steps} == {0, 1}
    assert {s["local_batch"] for s in steps} == {5, 3}
    assert all(s["compute_s"] > 0 and s["samples_per_s"] > 0 for s in steps)
    epochs = list(iter_records(tmp_path / "weighted.jsonl", "epoch"))
    assert len(epochs) == 1 and epochs[0]["steps"] == 8
