"""A co-location group on CPU torch (2 ranks, 2 jobs) trains each job as if it ran alone.

The group runtime (runtime/group.py) interleaves the jobs subtask by subtask:
one COMP at a time on each rank, the other job's all-reduce in flight on its
own process group meanwhile. Each job's parameters after training must equal
(within float tolerance) those of the same job run alone by the isolated
runtime (trainer.py), with uneven local batches, and every job must see each
of its samples exactly once per epoch. With a memory budget of 0 every
switch spills the idle job's parameters and optimizer state to host memory
and reloads them: the results must not change. One test per behaviour; all
share the runs (module fixture).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from group_helpers import group_job, group_plan, write_plan  # noqa: E402

from hetsched.core.spec import Job  # noqa: E402
from hetsched.runtime.job import (  # noqa: E402
    _local_group_main,
    _local_rank_main,
    build_config,
    build_group_config,
)
from hetsched.runtime.launcher import spawn_local  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process torch: `make test`, not `make test-fast`

#: uneven shares on the two ranks; ``b`` has Adam (optimizer state with a scalar step)
#: and multi-head attention (one layer of several modules in the slot's loader)
JOBS = (("a", "mlp", (6, 10), 64), ("b", "tiny-transformer", (3, 5), 40))
EPOCHS = 2


def _overrides(out: Path, **kw: Any) -> dict[str, Any]:
    return {"device": "cpu", "seed": 0, "checkpoint_every": 3, **kw}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("group")
    plan = write_plan(group_plan([group_job(n, w, b, dataset_size=d, epochs=EPOCHS)
                                  for n, w, b, d in JOBS]), tmp / "plan.json")
    # checkpoints and reports go to ROOT/BATCH/JOB (io/jobfiles.py): the plan's own id here
    out: dict[str, Any] = {"tmp": tmp, "batch": json.loads(plan.read_text())["plan_id"]}
    for name, budget in (("group", None), ("spill", 0.0)):
        d = tmp / name
        env = {"HETSCHED_CHECKPOINT_DIR": str(d / "ck"), "HETSCHED_REPORT_DIR": str(d / "rep")}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            cfg = build_group_config(str(plan), "g1", None, dict(__import__("os").environ),
                                     _overrides(d, save_params_dir=str(d), trace_dir=str(d / "tr"),
                                                memory_budget_mb=budget))
        assert spawn_local(2, _local_group_main, (cfg,), timeout_s=240) == [0, 0]
        out[name] = d
    for name, workload, batches, size in JOBS:
        d = tmp / f"alone-{name}"
        workers = [{"gpu_type": "v100", "node": n, "local_batch": b}
                   for n, b in zip(("n1", "n2"), batches, strict=True)]
        spec = Job(name=name, workload=workload, dataset_size=size, epochs=EPOCHS,
                   global_batch=sum(batches))
        cfg = build_config(spec, workers, 2, name, {}, _overrides(
            d, checkpoint=str(d / "ck.pt"), report=str(d / "rep.jsonl"),
            save_params=str(d / "params.pt")))
        d.mkdir()
        assert spawn_local(2, _local_rank_main, (cfg,), timeout_s=240) == [0, 0]
        out[f"alone-{name}"] = d
    return out


def _params(path: Path) -> dict[str, Any]:
    return dict(torch.load(path, weights_only=True))


@pytest.mark.parametrize("run", ["group", "spill"])
@pytest.mark.parametrize("job", [j[0] for j in JOBS])
def test_group_equals_alone(runs: dict[str, Any], run: str, job: str) -> None:
    grouped = _params(runs[run] / f"{job}.pt")
    alone = _params(runs[f"alone-{job}"] / "params.pt")
    assert grouped.keys() == alone.keys()
    for k in alone:
        assert torch.allclose(grouped[k], alone[k], rtol=1e-5, atol=1e-6), (job, k)


def test_training_changed_parameters(runs: dict[str, Any]) -> None:
    """Not a vacuous comparison: both jobs' parameters moved from their start."""
    from hetsched.runtime.workloads import load_workload

    for name, workload, _, size in JOBS:
        start = load_workload(workload, dataset_size=size, seed=0).model.state_dict()
        trained = _params(runs["group"] / f"{name}.pt")
        assert any(not torch.allclose(start[k], trained[k]) for k in start), name


@pytest.mark.parametrize("run", ["group", "spill"])
def test_each_sample_once_per_epoch(runs: dict[str, Any], run: str) -> None:
    for name, _, _, size in JOBS:
        seen: dict[int, list[int]] = {}
        for rank in (0, 1):
            for epoch, idx in json.loads((runs[run] / "tr" / f"{name}-r{rank}.json").read_text()):
                seen.setdefault(epoch, []).extend(idx)
        assert sorted(seen) == list(range(EPOCHS)), name
        for epoch, idx in seen.items():
            assert sorted(idx) == list(range(size)), (name, epoch)


def test_spill_and_reload_happened(runs: dict[str, Any]) -> None:
    """Budget 0: every switch spilled the idle job and reloaded it; without: never."""
    def last(run: str, job: str) -> dict[str, Any]:
        lines = (runs[run] / "rep" / runs["batch"] / f"{job}.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if '"kind": "group"' in x][-1]

    for job in ("a", "b"):
        assert last("group", job)["spills"] == 0
        spilled = last("spill", job)
        assert spilled["spills"] >= 8 and spilled["reloads"] >= 8, spilled


def test_checkpoints_and_reports_per_job(runs: dict[str, Any]) -> None:
    from hetsched.runtime.checkpoint import load_checkpoint

    for name, _, batches, size in JOBS:
        steps = EPOCHS * -(-size // sum(batches))
        ck = load_checkpoint(runs["group"] / "ck" / runs["batch"] / f"{name}.pt")
        assert ck is not None and ck["step"] == steps
        recs = [json.loads(x) for x in
                (runs["group"] / "rep" / runs["batch"] / f"{name}.jsonl").read_text().splitlines()]
        done = [r for r in recs if r["kind"] == "done"]
        assert done and done[0]["steps"] == steps and done[0]["group"] == "g1"
        assert sum(r["n"] for r in recs if r["kind"] == "steps" and r["rank"] == 0) == steps


def test_stop_by_signal_then_resume_equals_alone(runs: dict[str, Any]) -> None:
    """SIGTERM on one rank mid-run: every job agrees, checkpoints and stops; the rerun
    resumes each job from its checkpoint and ends where the job alone ends."""
    import os

    from rt_helpers import group_signalled

    d = runs["tmp"] / "signal"
    plan = str(runs["tmp"] / "plan.json")
    rep = d / "rep" / runs["batch"]
    # slowed (emulated 0.05 s per step) so the signal lands mid-run; numerics unchanged
    slow = {"HETSCHED_EMULATE_SPEED": "v100=1", "HETSCHED_EMULATE_COST": "0.05,0.001"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HETSCHED_CHECKPOINT_DIR", str(d / "ck"))
        mp.setenv("HETSCHED_REPORT_DIR", str(d / "rep"))
        cfg = build_group_config(plan, "g1", None, dict(os.environ),
                                 _overrides(d, checkpoint_every=100))
        resume = build_group_config(plan, "g1", None, dict(os.environ),
                                    _overrides(d, save_params_dir=str(d)))
        for m in cfg.members:
            m.report_every = 1
        for k, v in slow.items():
            mp.setenv(k, v)
        codes = spawn_local(2, group_signalled, (cfg, 1, str(rep / "a.jsonl"), 2),
                            timeout_s=240)
    assert codes == [0, 0]
    stopped = {}
    for name, _, batches, size in JOBS:
        recs = [json.loads(x) for x in (rep / f"{name}.jsonl").read_text().splitlines()]
        end = [r for r in recs if r["kind"] in ("done", "stopped")][-1]
        assert end["kind"] == "stopped" and end["reason"] == "signal", end
        total = EPOCHS * -(-size // sum(batches))
        assert 2 <= end["steps"] < total
        stopped[name] = end["steps"]
    assert spawn_local(2, _local_group_main, (resume,), timeout_s=240) == [0, 0]
    for name, *_ in JOBS:
        recs = [json.loads(x) for x in (rep / f"{name}.jsonl").read_text().splitlines()]
        done = [r for r in recs if r["kind"] == "done"][-1]
        assert done["steps_this_run"] == done["steps"] - stopped[name]
        grouped, alone = _params(d / f"{name}.pt"), _params(runs[f"alone-{name}"] / "params.pt")
        for k in alone:
            assert torch.allclose(grouped[k], alone[k], rtol=1e-5, atol=1e-6), (name, k)


@pytest.mark.parametrize("args, message", [
    (["--job", "a", "--group", "g1"], "give exactly one of --job and --group"),
    (["--group", "nope"], "no group 'nope' in the plan (groups: g1)"),
    (["--group", "g1", "--report", "r.jsonl"], "--checkpoint and --report name one job's"),
])
def test_run_group_bad_input_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    import subprocess
    import sys

    plan = write_plan(group_plan([group_job(n, w, b, dataset_size=d, epochs=EPOCHS)
                                  for n, w, b, d in JOBS]), tmp_path / "plan.json")
    r = subprocess.run([sys.executable, "-m", "hetsched", "run", "--plan", str(plan), *args],
                       capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
