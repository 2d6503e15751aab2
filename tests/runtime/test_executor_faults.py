"""A dead executor fails the whole pool job with one clear line, and a restart resumes
from the round checkpoints to the same parameters as an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from exec_helpers import MAIN, env, make_plan, plan_json
from test_executor_equivalence import SEED, SGD_JOBS, check

from hetsched.io.plan_json import load_plan
from hetsched.io.pool_reports import completed_rounds, read_pool_reports

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`


def _executors(parent: int) -> list[int]:
    """The spawned executor processes of a `hetsched exec --local` (start order)."""
    try:
        kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return []
    out = []
    for k in map(int, kids):
        try:
            cmd = Path(f"/proc/{k}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            out.append(k)
    return sorted(out)


def kill_after_two_rounds(args: list[str], env_: dict[str, str], plan: Path, ck: Path,
                          victim: int) -> str:
    """Start ``hetsched exec --local`` (``args``), SIGKILL executor ``victim`` once two
    rounds are checkpointed, and return its stderr; the pool job must exit 3."""
    proc = subprocess.Popen(args, env=env_, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    victims: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(completed_rounds(load_plan(plan), ck).values()) >= 2:
            victims = _executors(proc.pid)
            break
        time.sleep(0.05)
    assert len(victims) == 2, "the executors did not checkpoint in time"
    os.kill(victims[victim], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    return err


@pytest.mark.parametrize("victim", [1, 0])  # an executor, and rank 0 (the coordinator's host)
def test_killed_executor_fails_all_then_restart_resumes(tmp_path: Path, victim: int) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=1, jobs=SGD_JOBS)
    d = plan_json(plan)
    pid_, ck, rep = d["plan_id"], tmp_path / "ck", tmp_path / "rep"
    slow = {**env(), "HETSCHED_EMULATE_SPEED": "v100=1,k80=1",
            "HETSCHED_EMULATE_COST": "0.08,0.001"}
    args = [sys.executable, "-c", MAIN, "exec", "--plan", str(plan), "--local", "--seed",
            str(SEED), "--report-dir", str(rep), "--checkpoint-dir", str(ck)]
    err = kill_after_two_rounds(args, slow, plan, ck, victim)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    survivor = d["tasks"]["gpus"][1 - victim]
    mine = [ln for ln in lines if f"exec GPU {survivor['node']}-g{survivor['gpu']}:" in ln]
    assert len(mine) == 1 and "pool job failed" in mine[0] and "hetsched replan" in mine[0], err
    assert "Traceback" not in err
    before = completed_rounds(load_plan(plan), ck)
    jobs = d["tasks"]["jobs"]
    assert 0 < sum(before.values()) < sum(j["rounds"] for j in jobs.values())

    r = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert completed_rounds(load_plan(plan), ck) == {n: j["rounds"] for n, j in jobs.items()}
    prog = read_pool_reports(rep, pid_, {n: j["tasks_per_round"] for n, j in jobs.items()})
    assert all(prog.jobs[n].done and prog.jobs[n].rounds_done == j["rounds"]
               for n, j in jobs.items())
    diffs = check(plan, ck)  # resumed training = uninterrupted training
    assert max(diffs.values()) < 2e-5, diffs


def test_executor_that_never_connects_fails_the_pool_job(tmp_path: Path) -> None:
    import torch

    from hetsched.io.secret import new_secret
    from hetsched.runtime.executor.entry import ExecFailed, run_gpu
    from hetsched.runtime.executor.plan import exec_plan
    from hetsched.runtime.launcher import free_port

    plan = make_plan(tmp_path, gpus=2, task_iterations=1, jobs=SGD_JOBS)
    xp = exec_plan(load_plan(plan))
    gpus = xp.gpu_ids()
    t0 = time.monotonic()
    with pytest.raises(ExecFailed, match=f"executor for GPU {gpus[1]} never connected"):
        run_gpu(xp, gpus[0], gpus, True, "127.0.0.1", free_port(), new_secret(),
                torch.device("cpu"),
                {"hello_timeout_s": 2.0})
    assert time.monotonic() - t0 < 60


def test_replanned_remainder_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """The hand-over `hetsched replan` makes (app/pool_replan.py): the remaining
    iterations planned anew, rounds renumbered to continue, checkpoints carried to the
    new plan's directory; the executors of the new plan finish the training exactly."""

    from hetsched.app.pool_replan import (
        _new_plan,
        _remaining,
        carry_checkpoints,
        iterations_left,
        round_iterations,
        steps_before,
    )
    from hetsched.io.plan_json import save_plan
    from hetsched.io.profiles import load_throughputs
    from hetsched.io.specs import load_cluster
    from hetsched.runtime.executor.entry import run_threads

    plan = make_plan(tmp_path, gpus=2, task_iterations=1, jobs=SGD_JOBS)
    old = load_plan(plan)
    ck = tmp_path / "ck"
    n = {"tasks": 0}

    def stop_after_some(_rec: dict[str, Any]) -> None:
        n["tasks"] += 1
        if n["tasks"] == 6:
            raise RuntimeError("executor killed (test)")

    assert old.tasks is not None
    gpus = [g.id for g in old.tasks.gpus]
    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "seed": SEED,
                                            "on_task": stop_after_some})
    assert not all(isinstance(r, dict) for r in res) and len(res) == len(gpus)
    done = completed_rounds(old, ck)
    meta = old.tasks.jobs
    assert 0 < sum(done.values()) < sum(m.rounds for m in meta.values()), done
    own = round_iterations(old.tasks)
    left = [_remaining(j.spec, iterations_left(old, own, j.name, done[j.name]))
            for j in old.jobs if j.spec is not None and done[j.name] < meta[j.name].rounds]
    offsets = {j.name: done[j.name] for j in left}
    new = _new_plan(old, left, offsets, load_cluster(tmp_path / "cluster.yaml"),
                    load_throughputs(tmp_path / "tp.csv"), None,
                    {n: steps_before(old, own, n, k) for n, k in offsets.items()})
    assert new.plan_id is not None
    carry_checkpoints(ck, str(old.plan_id), new.plan_id, [k for k, v in offsets.items() if v])
    save_plan(new, tmp_path / "replan.json")
    res = run_threads(str(tmp_path / "replan.json"), {"checkpoint_dir": str(ck), "seed": SEED})
    assert all(isinstance(r, dict) for r in res), res
    for name in offsets:  # the replanned jobs end where uninterrupted training ends
        (tmp_path / "ck" / str(old.plan_id) / f"{name}.pt").write_bytes(
            (ck / new.plan_id / f"{name}.pt").read_bytes())
    diffs = check(plan, ck)
    assert max(diffs.values()) < 2e-5, diffs


def test_replanned_uneven_remainder_goes_on_at_the_step_reached(tmp_path: Path) -> None:
    """Rounds of different iterations and task counts, killed midway and replanned as
    `hetsched replan` does: the new plan's executors start the job at the global step
    its completed rounds reached (not rounds x task size), so the parameters equal one
    process taking one step per round of the old plan's completed rounds, then of the
    new plan's, each on the samples of its global steps."""
    import numpy as np
    import torch
    from test_executor_equivalence import SEED

    from hetsched.app.pool_replan import (
        _new_plan,
        _remaining,
        carry_checkpoints,
        iterations_left,
        round_iterations,
        steps_before,
    )
    from hetsched.io.plan_json import plan_from_dict, save_plan
    from hetsched.io.profiles import load_throughputs
    from hetsched.io.specs import load_cluster
    from hetsched.runtime.executor.entry import run_threads
    from hetsched.runtime.executor.plan import exec_plan
    from hetsched.runtime.workloads import gather, load_workload

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
    from pool_slurm_helpers import with_layout

    jobs = ("jobs:\n  - {name: a, workload: cnn, dataset_size: 60, epochs: 1, "
            "global_batch: 10, max_gpus: 2, memory_gb: 1}\n")
    path = make_plan(tmp_path, gpus=2, task_iterations=2, jobs=jobs, space="seed")
    layout = [(1, (10,)), (2, (6, 4)), (1, (10,)), (2, (5, 5))]  # 6 iterations, size 2
    old = plan_from_dict(with_layout(plan_json(path), "a", layout), "uneven")
    old.plan_id = str(old.to_dict()["plan_id"])
    save_plan(old, path)
    ck, n = tmp_path / "ck", {"tasks": 0}

    def stop_after_some(_rec: dict[str, Any]) -> None:
        n["tasks"] += 1
        if n["tasks"] == 3:
            raise RuntimeError("executor killed (test)")

    res = run_threads(str(path), {"checkpoint_dir": str(ck), "seed": SEED,
                                  "on_task": stop_after_some})
    assert not all(isinstance(r, dict) for r in res)
    k = completed_rounds(old, ck)["a"]
    own = round_iterations(old.tasks)  # type: ignore[arg-type]
    steps = steps_before(old, own, "a", k)
    assert 0 < k < len(layout) and steps != 2 * k, (k, steps)
    left = _remaining(old.jobs[0].spec, iterations_left(old, own, "a", k))  # type: ignore[arg-type]
    new = _new_plan(old, [left], {"a": k}, load_cluster(tmp_path / "cluster.yaml"),
                    load_throughputs(tmp_path / "tp.csv"), None, {"a": steps})
    carry_checkpoints(ck, str(old.plan_id), str(new.plan_id), ["a"])
    save_plan(new, tmp_path / "replan.json")
    res = run_threads(str(tmp_path / "replan.json"), {"checkpoint_dir": str(ck), "seed": SEED})
    assert all(isinstance(r, dict) for r in res), res
    xo = exec_plan(old).jobs["a"]
    xn = exec_plan(plan_from_dict(plan_json(tmp_path / "replan.json"))).jobs["a"]
    wl = load_workload("cnn", dataset_size=60, seed=SEED)
    opt = wl.optimizer(wl.model.parameters())
    step = 0  # global steps counted here, one after the other: the uninterrupted order
    for xj, r in [(xo, r) for r in range(k)] + [(xn, r) for r in range(k, xn.rounds)]:
        parts = []
        for _ in range(xj.round_iterations(r)):
            off, m = xj.step_samples(step)
            perm = np.random.default_rng([SEED, step // xj.steps_per_epoch()]).permutation(60)
            parts.append(perm[off:off + m])
            step += 1
        x, y = gather(wl.dataset, np.concatenate(parts))
        opt.zero_grad()
        wl.loss_fn(wl.model(x), y).backward()
        opt.step()
    assert step == sum(it for it, _ in layout)
    ref = torch.cat([p.detach().reshape(-1) for p in wl.model.parameters()])
    got = torch.load(ck / str(new.plan_id) / "a.pt", weights_only=True)["params"]
    assert float((got - ref).abs().max()) < 2e-5


def test_the_last_bye_is_answered_before_the_gpu_counts_as_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's process ends as soon as every GPU said bye (``wait_done``); the
    coordinator answers a ``bye`` before it counts the GPU done, so the last executor
    never finds the coordinator gone while it waits for that answer (seen on the
    testbed: "coordinator lost (connection closed)" on a finished pool)."""
    from hetsched.io.secret import new_secret
    from hetsched.runtime.executor import coordinator as coord_mod
    from hetsched.runtime.executor import protocol
    from hetsched.runtime.executor.coordinator import Coordinator
    from hetsched.runtime.executor.plan import exec_plan

    xplan = exec_plan(load_plan(make_plan(tmp_path, gpus=1, task_iterations=1)))
    gid = xplan.gpu_ids()[0]
    key = new_secret()
    lis = protocol.listen("127.0.0.1", 0)
    c = Coordinator(xplan, [gid], lis, key, None, hello_timeout_s=60.0)
    seen: list[bool] = []
    send = protocol.send

    def spy(ch: Any, head: dict[str, Any], payload: Any = None) -> None:
        if head == {} and seen == [] and c.hello:  # the bye's answer
            seen.append(gid in c.bye)
        send(ch, head, payload)

    monkeypatch.setattr(coord_mod.protocol, "send", spy)
    try:
        ch = protocol.connect("127.0.0.1", lis.getsockname()[1], key, gid, timeout_s=10)
        ch.settimeout(10)
        send(ch, {"op": "hello", "gpu": gid})
        protocol.recv(ch)
        send(ch, {"op": "bye", "gpu": gid})
        assert protocol.recv(ch)[0] == {}
        ch.close()
        assert c.wait_done() is None
    finally:
        c.close()
    assert seen == [False]  # answered while the GPU was not yet counted done
