"""Shared memory between the coordinator and the executors of its node: the same
parameters as over TCP (bit for bit), the bytes never cross the socket, every segment
gone from /dev/shm after start-up and after a kill, and each hostile request refused
with nothing applied."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from exec_helpers import MAIN, env, loopback_coordinator, make_plan, plan_json, small_exec_plan  # noqa: E402

from hetsched.io.plan_json import load_plan  # noqa: E402
from hetsched.io.pool_reports import completed_rounds  # noqa: E402
from hetsched.io.reports import iter_records  # noqa: E402
from hetsched.runtime.executor import protocol, shm  # noqa: E402
from hetsched.runtime.executor.entry import run_threads  # noqa: E402
from hetsched.runtime.executor.plan import ExecPlan  # noqa: E402
from hetsched.runtime.executor.state import checkpoint_path  # noqa: E402

pytestmark = pytest.mark.skipif(not shm.available(), reason="no writable /dev/shm")

T = 20.0


def ours() -> set[str]:
    return {p.name for p in shm.SHM_DIR.glob(shm.PREFIX + "*")}


def _params(ck: Path, plan_id: str, jobs: list[str]) -> dict[str, Any]:
    return {j: torch.load(checkpoint_path(ck, plan_id, j), weights_only=True)["params"]
            for j in jobs}


def test_both_transports_give_bit_identical_parameters(tmp_path: Path) -> None:
    # one GPU: every round's contributions arrive in the same order, so equal bits
    plan = make_plan(tmp_path, gpus=1, task_iterations=1)
    p = load_plan(plan)
    jobs = [j.name for j in p.jobs]
    before = ours()
    got = {}
    for transport in ("tcp", "auto"):
        ck, rep = tmp_path / f"ck-{transport}", tmp_path / f"rep-{transport}"
        res = run_threads(str(plan), {"seed": 0, "checkpoint_dir": str(ck),
                                      "report_dir": str(rep), "transport": transport})
        assert all(isinstance(r, dict) for r in res), res
        got[transport] = _params(ck, str(p.plan_id), jobs)
        (f,) = sorted((rep / str(p.plan_id)).glob("gpu-*.jsonl"))
        tasks = list(iter_records(f, "task"))
        (summ,) = list(iter_records(f, "executor"))
        want = "tcp" if transport == "tcp" else "shm"
        assert tasks and {t["via"] for t in tasks} == {want}
        assert summ["transport"] == want
    for j in jobs:
        assert torch.equal(got["tcp"][j], got["auto"][j]), j
    assert ours() <= before and shm.created_here() == []


def test_the_tcp_path_is_forced_by_the_environment(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(tmp_path, gpus=1, task_iterations=1)
    monkeypatch.setenv(shm.TRANSPORT_VAR, "tcp")
    rep = tmp_path / "rep"
    res = run_threads(str(plan), {"seed": 0, "report_dir": str(rep)})
    assert all(isinstance(r, dict) for r in res), res
    (f,) = sorted((rep / str(load_plan(plan).plan_id)).glob("gpu-*.jsonl"))
    assert {t["via"] for t in iter_records(f, "task")} == {"tcp"}
    monkeypatch.setenv(shm.TRANSPORT_VAR, "carrier-pigeon")
    r = subprocess.run([sys.executable, "-c", MAIN, "exec", "--plan", str(plan), "--local"],
                       env={**env(), shm.TRANSPORT_VAR: "carrier-pigeon"}, text=True,
                       capture_output=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "HETSCHED_EXEC_TRANSPORT" in r.stderr and "valid: auto, tcp" in r.stderr


# -- the coordinator's side: hostile requests -------------------------------------------


@pytest.fixture(scope="module")
def xplan(tmp_path_factory: pytest.TempPathFactory) -> ExecPlan:
    return small_exec_plan(tmp_path_factory.mktemp("shm"))


@pytest.fixture
def coord(xplan: ExecPlan) -> Any:
    c = loopback_coordinator(xplan)
    yield c
    c.close()
    assert not any(s.name in ours() for s in c.grad_segs.values())


def call(ch: protocol.Channel, head: dict[str, Any], payload: Any = None,
         into: Any = None) -> dict[str, Any]:
    protocol.send(ch, head, payload)
    reply, _ = protocol.recv(ch, into)
    return reply


def attached(c: Any, gpu: str | None = None, prove: bool = True
             ) -> tuple[protocol.Channel, dict[str, tuple[shm.Segment, shm.Segment]]]:
    """A real executor's main connection that took the shared memory offer."""
    gpu = gpu or c.gpus[0]
    ch = protocol.connect("127.0.0.1", c.port, c.key, gpu, timeout_s=T)
    ch.settimeout(T)
    offer = call(ch, {"op": "hello", "gpu": gpu, "node": shm.node_identity()})["shm"]
    segs = {j: (shm.Segment.attach(offer["params"][j], c.jobs[j].seg.nbytes, False),
                shm.Segment.attach(offer["grads"][j], c.jobs[j].seg.nbytes, True))
            for j in offer["params"]}
    tokens = {j: (p.token.hex() + g.token.hex()) if prove else "00" * 32
              for j, (p, g) in segs.items()}
    assert call(ch, {"op": "shm", "gpu": gpu, "tokens": tokens}) == {"shm": prove}
    return ch, segs


def untouched(c: Any, before: dict[str, Any]) -> bool:
    return all(s.version == 0 and not s.got and float(s.grad.abs().sum()) == 0.0
               and torch.equal(s.flat, before[n]) for n, s in c.jobs.items())


def test_an_executor_of_this_node_gets_parameters_and_puts_gradients_in_shared_memory(
        coord: Any) -> None:
    ch, segs = attached(coord)
    job = sorted(segs)[0]
    srv = coord.jobs[job]
    out = np.zeros(srv.flat.numel(), np.float32)
    reply = call(ch, {"op": "get", "job": job, "round": 0, "have": -1}, into=out)
    assert reply == {"version": 0, "shm": True} and not out.any()  # nothing on the socket
    segs[job][0].read_params(out, 0)
    assert np.array_equal(out, srv.flat.numpy())
    before = srv.flat.clone()
    g = np.full(srv.flat.numel(), 0.5, np.float32)
    for task in range(srv.job.tasks_per_round):
        seq = segs[job][1].write_grad(g, 0, task)
        r = call(ch, {"op": "put", "job": job, "round": 0, "task": task,
                      "shm": {"name": segs[job][1].name, "nbytes": len(g) * 4, "seq": seq}})
        assert "error" not in r, r
    assert srv.version == 1 and not torch.equal(srv.flat, before)
    with pytest.raises(shm.ShmRefused, match="not version 0"):
        segs[job][0].read_params(out, 0)  # the segment holds version 1 now
    segs[job][0].read_params(out, 1)
    assert np.array_equal(out, srv.flat.numpy())
    assert coord.failed is None


def test_names_are_gone_from_dev_shm_once_every_gpu_answered(coord: Any) -> None:
    params = {s.seg.name for s in coord.jobs.values()}
    assert params <= ours()
    ch0, _ = attached(coord, coord.gpus[0])
    assert not {s.name for (g, _), s in coord.grad_segs.items() if g == coord.gpus[0]} & ours()
    assert params <= ours()  # the other GPU has not said hello yet
    ch1, _ = attached(coord, coord.gpus[1])
    assert not params & ours() and not {s.name for s in coord.grad_segs.values()} & ours()
    # the mappings still work after the names went
    job = sorted(coord.jobs)[0]
    assert coord.jobs[job].seg.head()[1] == 0
    for ch in (ch0, ch1):
        ch.close()


@pytest.mark.parametrize("attack", ["params-name", "other-gpu", "path", "nbytes", "stale",
                                    "payload", "unproven", "unoffered", "round", "nan"])
def test_a_hostile_shared_memory_put_is_refused_and_nothing_applied(coord: Any,
                                                                    attack: str) -> None:
    before = {n: s.flat.clone() for n, s in coord.jobs.items()}
    ch, segs = attached(coord, coord.gpus[0], prove=attack != "unproven")
    job = sorted(segs)[0]
    gseg = segs[job][1]
    n = coord.jobs[job].seg.nbytes
    rnd = 1 if attack == "round" else 0
    fill = np.nan if attack == "nan" else 1.0
    seq = gseg.write_grad(np.full(n // 4, fill, np.float32), rnd, 0)
    desc: dict[str, Any] = {"name": gseg.name, "nbytes": n, "seq": seq}
    head: dict[str, Any] = {"op": "put", "job": job, "round": rnd, "task": 0}
    payload = None
    if attack == "params-name":
        desc["name"] = coord.jobs[job].seg.name  # the master parameters' segment
    elif attack == "other-gpu":
        ch1, segs1 = attached(coord, coord.gpus[1])
        other = [s for (g, j), s in coord.grad_segs.items() if g == coord.gpus[1]]
        desc["name"] = other[0].name
    elif attack == "path":
        desc["name"] = "../../etc/passwd"
    elif attack == "nbytes":
        desc["nbytes"] = n - 4
    elif attack == "stale":
        desc["seq"] = seq - 1  # an older write
    elif attack == "payload":
        payload = np.ones(n // 4, np.float32)
    head["shm"] = desc
    if attack == "unoffered":  # a side connection answering an offer it never got
        pull = protocol.connect("127.0.0.1", coord.port, coord.key, coord.gpus[0],
                                timeout_s=T, channel="pull")
        pull.settimeout(T)
        r = call(pull, {"op": "shm", "gpu": coord.gpus[0], "tokens": {}})
    else:
        r = call(ch, head, payload)
    assert "error" in r and len(r["error"].splitlines()) == 1, r
    want = {"params-name": "is not the one given", "other-gpu": "is not the one given",
            "path": "is not the one given", "nbytes": "expected", "stale": "not the announced",
            "payload": "carries a payload", "unproven": "given no shared memory",
            "unoffered": "unknown request",
            "round": "gradient for round 1 while the job is at round 0",
            "nan": "NaN or infinite"}[attack]
    assert want in r["error"], r
    assert untouched(coord, before)
    ch.close()


def test_an_executor_refuses_a_segment_that_is_not_right(tmp_path: Path) -> None:
    seg = shm.Segment.create(64)
    try:
        shm.Segment.attach(seg.name, 64, False)  # the right one opens
        with pytest.raises(shm.ShmRefused, match="has 128 bytes; .* exactly 132"):
            shm.Segment.attach(seg.name, 64 + 4, False)  # another job's size
        with pytest.raises(shm.ShmRefused, match="is not one the coordinator makes"):
            shm.Segment.attach("../" + seg.name, 64, False)
        with pytest.raises(shm.ShmRefused, match="is not one the coordinator makes"):
            shm.Segment.attach({"evil": 1}, 64, False)
        os.chmod(shm.SHM_DIR / seg.name, 0o644)
        with pytest.raises(shm.ShmRefused, match="others could read"):
            shm.Segment.attach(seg.name, 64, False)
        os.chmod(shm.SHM_DIR / seg.name, 0o600)
        with open(shm.SHM_DIR / seg.name, "r+b") as f:
            f.write(b"NOTMAGIC")
        with pytest.raises(shm.ShmRefused, match="not a segment of 64 bytes"):
            shm.Segment.attach(seg.name, 64, False)
    finally:
        seg.unlink()
    assert seg.name not in ours()


def test_an_executor_fails_the_pool_job_on_a_wrong_size_offer(tmp_path: Path) -> None:
    """The coordinator (authenticated) offers a segment of the wrong size: the executor
    refuses it with one line and the pool job fails; nothing is applied."""
    from hetsched.runtime.executor import coordinator as coordinator_mod
    from hetsched.runtime.executor.entry import ExecFailed

    plan = make_plan(tmp_path, gpus=1, task_iterations=1)
    orig = coordinator_mod.Coordinator._offer

    def offer(self: Any, gpu: str, node: Any) -> Any:
        out = orig(self, gpu, node)
        job = sorted(out["grads"])[0]
        self.grad_segs[(gpu, job)].unlink()
        bad = shm.Segment.create(self.jobs[job].seg.nbytes + 8)
        self.grad_segs[(gpu, job)] = bad  # unlinked with the others
        out["grads"][job] = bad.name
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(coordinator_mod.Coordinator, "_offer", offer)
    try:
        res = run_threads(str(plan), {"seed": 0, "checkpoint_dir": str(tmp_path / "ck")})
    finally:
        mp.undo()
    assert isinstance(res[0], ExecFailed), res
    msg = str(res[0])
    assert len(msg.splitlines()) == 1 and "this job's parameters need exactly" in msg
    assert "refused" in msg
    assert completed_rounds(load_plan(plan), tmp_path / "ck") == {j.name: 0
                                                                   for j in load_plan(plan).jobs}
    assert shm.created_here() == []


# -- real processes ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])  # an executor; rank 0 (the coordinator's process)
def test_processes_use_shared_memory_and_a_kill_leaves_nothing_in_dev_shm(
        tmp_path: Path, victim: int) -> None:
    from test_executor_faults import kill_after_two_rounds

    plan = make_plan(tmp_path, gpus=2, task_iterations=1)
    d = plan_json(plan)
    ck, rep = tmp_path / "ck", tmp_path / "rep"
    slow = {**env(), "HETSCHED_EMULATE_SPEED": "v100=1,k80=1",
            "HETSCHED_EMULATE_COST": "0.08,0.001"}
    before = ours()
    args = [sys.executable, "-c", MAIN, "exec", "--plan", str(plan), "--local", "--seed", "0",
            "--report-dir", str(rep), "--checkpoint-dir", str(ck)]
    err = kill_after_two_rounds(args, slow, plan, ck, victim)
    assert "Traceback" not in err
    assert ours() <= before, "a segment of the killed pool job is left in /dev/shm"
    vias = [t["via"] for f in (rep / d["plan_id"]).glob("gpu-*.jsonl")
            for t in iter_records(f, "task")]
    assert vias and set(vias) == {"shm"}, vias
