"""Elastic batch at run time: rescale in place equals one process on the same batch schedule.

Two real ranks (gloo, CPU, emulated 50 ms steps) train with shares 5/3; a
rescale request written while they run changes the shares to 9/7 (global
batch 8 -> 16, linear LR scaling) at whatever step boundary they reach.
One process then trains with batch 8 for exactly that many steps and, from
its checkpoint, with batch 16 and the LR scaled: the parameters must agree.
A second request for three ranks cannot be applied in place: the ranks
checkpoint and stop with reason ``rescale``, and three ranks resume it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from rt_helpers import train_many  # noqa: E402

from hetsched.io.reports import iter_records  # noqa: E402
from hetsched.runtime.elastic import read_request, steps_left, write_request  # noqa: E402
from hetsched.runtime.launcher import RankEnv, spawn_local  # noqa: E402
from hetsched.runtime.sampler import ShareSampler  # noqa: E402
from hetsched.runtime.trainer import TrainConfig, train  # noqa: E402

DATA = 240
EMUL = {"OMP_NUM_THREADS": "1", "HETSCHED_EMULATE_SPEED": "x=1",
        "HETSCHED_EMULATE_COST": "0.05,0.0001"}


def _cfg(tmp: Path, name: str, batches: list[int], **kw: object) -> TrainConfig:
    kw.setdefault("lr_scaling", "linear")
    return TrainConfig(job=name, workload="mlp", dataset_size=DATA, epochs=2.0,
                       local_batches=batches, save_params=str(tmp / f"{name}.params"),
                       report=str(tmp / f"{name}.jsonl"), device="cpu", base_batch=8,
                       **kw)  # type: ignore[arg-type]


def _diff(a: Path, b: Path) -> float:
    x, y = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.mark.slow
def test_rescale_in_place_equals_one_process(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    req = tmp_path / "el.rescale.json"
    el = _cfg(tmp_path, "el", [5, 3], rescale_request=str(req), gpu_types=["x", "x"],
              report_every=1)
    codes = spawn_local(2, train_many, ([el], None, (12, str(req), [9, 7])), extra_env=EMUL,
                        timeout_s=120)
    assert codes == [0, 0]
    resc = list(iter_records(tmp_path / "el.jsonl", "rescale"))
    assert len(resc) == 1 and resc[0]["in_place"] and resc[0]["new"] == [9, 7]
    k = resc[0]["step"]
    assert 12 <= k < 60, k  # mid-run, mid-epoch (60 steps at batch 8)
    assert resc[0]["pause_s"] < 0.5
    done = list(iter_records(tmp_path / "el.jsonl", "done"))
    assert done[0]["steps"] == k + steps_left(DATA, 16, (k * 8) // DATA, (k * 8) % DATA, 2.0)
    gns = [r["gns"] for r in iter_records(tmp_path / "el.jsonl", "steps") if r["rank"] == 0]
    assert gns[-1] is not None and gns[-1] > 0  # measured from the ranks' gradients

    ck = str(tmp_path / "ref.pt")
    part1 = _cfg(tmp_path, "ref", [8], checkpoint=ck, max_steps=k, checkpoint_every=10_000)
    train(part1, RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    part2 = _cfg(tmp_path, "ref", [16], checkpoint=ck)
    train(part2, RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    assert _diff(tmp_path / "el.params", tmp_path / "ref.params") < 1e-5
    # without the LR rule the same schedule is a different model: the test can fail
    flat = _cfg(tmp_path, "flat", [8], checkpoint=str(tmp_path / "flat.pt"), max_steps=k,
                lr_scaling="none")
    train(flat, RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    train(_cfg(tmp_path, "flat", [16], checkpoint=str(tmp_path / "flat.pt"), lr_scaling="none"),
          RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    assert _diff(tmp_path / "flat.params", tmp_path / "ref.params") > 1e-4


@pytest.mark.slow
def test_other_rank_count_checkpoints_and_restarts(tmp_path: Path) -> None:
    ck = tmp_path / "mv.pt"
    req = Path(str(ck) + ".rescale.json")  # the default place, next to the checkpoint
    mv = _cfg(tmp_path, "mv", [5, 3], checkpoint=str(ck), gpu_types=["x", "x"], report_every=1)
    codes = spawn_local(2, train_many, ([mv], None, (9, str(req), [4, 4, 4])),
                        extra_env=EMUL, timeout_s=120)
    assert codes == [0, 0]
    stop = list(iter_records(tmp_path / "mv.jsonl", "stopped"))
    assert len(stop) == 1 and stop[0]["reason"] == "rescale"
    k = stop[0]["steps"]
    assert torch.load(ck, weights_only=False)["step"] == k
    codes = spawn_local(3, train_many, ([_cfg(tmp_path, "mv", [4, 4, 4], checkpoint=str(ck))],),
                        extra_env={"OMP_NUM_THREADS": "1"}, timeout_s=120)
    assert codes == [0, 0, 0]
    assert read_request(req) is not None
    torch.set_num_threads(1)
    ref_ck = str(tmp_path / "r.pt")
    train(_cfg(tmp_path, "r", [8], checkpoint=ref_ck, max_steps=k),
          RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    train(_cfg(tmp_path, "r", [12], checkpoint=ref_ck), RankEnv(0, 1, 0, "local", "127.0.0.1", 0))
    assert _diff(tmp_path / "mv.params", tmp_path / "r.params") < 1e-5


@settings(max_examples=60, deadline=None)
@given(st.integers(5, 80), st.lists(st.integers(1, 9), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(1, 40), st.integers(1, 9)), max_size=4),
       st.integers(0, 3))
def test_every_sample_once_per_epoch_across_rescales(data: int, shares: list[int],
                                                      changes: list[tuple[int, int]],
                                                      seed: int) -> None:
    ranks = [ShareSampler(data, shares, r, seed=seed) for r in range(len(shares))]
    at = {}
    step = 0
    for gap, scale in changes:
        step += gap
        at[step] = [max(1, (s * scale) % 11) for s in shares]
    seen: dict[int, list[int]] = {}
    for s in range(step + 3 * data):
        if s in at:
            for smp in ranks:
                smp.set_shares(at[s])
        epoch = ranks[0].state.epoch
        for smp in ranks:
            idx, _ = smp.next()
            seen.setdefault(epoch, []).extend(int(i) for i in idx)
        if ranks[0].state.epoch >= 3:
            break
    for e in range(3):
        assert sorted(seen[e]) == list(range(data)), e


def test_write_request_is_atomic_and_numbered(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    assert write_request(p, [3, 5]) == 1
    assert write_request(p, [4, 4]) == 2
    r = read_request(p)
    assert r is not None and r.seq == 2 and r.local_batches == [4, 4]
    with pytest.raises(ValueError):
        write_request(p, [0, 4])
    assert np.array_equal(sorted(x.name for x in tmp_path.iterdir()), ["r.json"])


def test_replan_writes_a_rescale_request_when_gpus_stay(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from hetsched.app.space_replan import _rescale_in_place

    ckpt = tmp_path / "b1" / "r18.pt"  # the running job's checkpoint (io/jobfiles.py)
    old = [{"node": "n0", "gpu_type": "v100", "gpu": 0, "local_batch": 64},
           {"node": "n0", "gpu_type": "v100", "gpu": 1, "local_batch": 64}]
    new = [dict(w, local_batch=b) for w, b in zip(old, (96, 160), strict=True)]
    logs: list[str] = []
    assert _rescale_in_place("r18", old, old, logs.append, False, ckpt)  # same: no request
    req = Path(str(ckpt) + ".rescale.json")
    assert not req.exists() and not logs
    assert _rescale_in_place("r18", new, old, logs.append, False, ckpt)
    moved = [dict(w, node="n1") for w in new]
    assert not _rescale_in_place("r18", moved, old, logs.append, False, ckpt)  # restart
    r = read_request(req)
    assert r is not None and r.local_batches == [96, 160] and r.seq == 1
    assert "rescale in place" in logs[0]
