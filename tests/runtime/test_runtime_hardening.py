"""Signals reach the ranks of ``hetsched run --local``, bad checkpoints are one
line, and checkpoints load with ``weights_only=True``.

Real processes: the CLI in a subprocess, its spawned ranks found in /proc, real signals.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
CLI = "from hetsched.cli.main import main; main()"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def hetsched(*args: str, cwd: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300, **kw)  # type: ignore


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("rt")
    (d / "c.yaml").write_text("nodes:\n  - name: local-1\n    gpu_type: cpu\n    gpus: 2\n")
    (d / "p.csv").write_text("workload,gpu_type,local_batch,step_time_s\n"
                             "mlp,cpu,16,0.01\nmlp,cpu,64,0.03\n")
    (d / "j.yaml").write_text("jobs:\n  - name: long\n    workload: mlp\n    dataset_size: 4096\n"
                              "    epochs: 1000\n    global_batch: 64\n    min_gpus: 2\n")
    r = hetsched("plan", "j.yaml", "--cluster", "c.yaml", "--throughputs", "p.csv",
                 "--out", "plan.json", "--format", "json", cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(plan_dir: Path, tag: str) -> tuple[subprocess.Popen[str], Path, list[int]]:
    report = plan_dir / f"{tag}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "run", "--plan", "plan.json", "--job", "long", "--local",
         "--device", "cpu", "--checkpoint", f"{tag}.pt", "--report", str(report)],
        cwd=plan_dir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240  # torch imports are slow on a loaded 2-core VM
    while time.monotonic() < deadline:
        if report.exists() and '"steps"' in report.read_text():
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the ranks never reported a step")
    ranks = [c for c in _children(proc.pid)
             if "spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes().decode(errors="replace")]
    assert len(ranks) == 2, ranks
    return proc, report, ranks


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_local_run_reaches_every_rank(plan_dir: Path, sig: int) -> None:
    tag = f"sig{sig}"
    proc, report, ranks = _start(plan_dir, tag)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    try:
        assert _gone(ranks, 30), "ranks left running as orphans"
    finally:
        for p in ranks:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    (plan_dir / f"{tag}.err").write_text(err)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"stopped by {signal.Signals(sig).name}" in lines[0], err
    # the ranks stopped gracefully: they agreed, checkpointed and reported it
    assert '"stopped"' in report.read_text()
    assert (plan_dir / f"{tag}.pt").exists()


def test_sigkill_of_the_launcher_leaves_no_orphans(plan_dir: Path) -> None:
    proc, _, ranks = _start(plan_dir, "kill9")
    proc.kill()
    proc.communicate(timeout=60)
    try:
        assert _gone(ranks, 60), "ranks outlived a SIGKILLed launcher"
    finally:
        for p in ranks:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _one_line_refusal(plan_dir: Path, ckpt: Path, *needles: str) -> None:
    r = hetsched("run", "--plan", "plan.json", "--job", "long", "--local", "--device", "cpu",
                 "--checkpoint", str(ckpt), "--max-steps", "1", cwd=plan_dir)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(ckpt) in lines[0]
    for n in needles:
        assert n in lines[0], lines[0]


def test_corrupted_checkpoints_are_one_line(plan_dir: Path) -> None:
    garbage = plan_dir / "garbage.pt"
    garbage.write_bytes(os.urandom(4096))
    _one_line_refusal(plan_dir, garbage, "not a readable checkpoint")
    good = plan_dir / "good.pt"
    r = hetsched("run", "--plan", "plan.json", "--job", "long", "--local", "--device", "cpu",
                 "--checkpoint", str(good), "--max-steps", "2", cwd=plan_dir)
    assert r.returncode == 0, r.stderr
    truncated = plan_dir / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    _one_line_refusal(plan_dir, truncated, "truncated or corrupted")
    other = plan_dir / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    _one_line_refusal(plan_dir, other, "not a hetsched checkpoint")
    future = plan_dir / "future.pt"
    torch.save({"format": 99}, future)
    _one_line_refusal(plan_dir, future, "unknown checkpoint format 99")


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_crafted_checkpoint_runs_no_code(plan_dir: Path) -> None:
    marker = plan_dir / "PWNED"
    for protocol, needle in ((2, "would run code"), (pickle.HIGHEST_PROTOCOL, "checkpoint")):
        evil = plan_dir / f"evil{protocol}.pt"
        torch.save({"format": 2, "step": 0, "sampler": {}, "model": {}, "optimizer": {},
                    "rng": _Evil(marker)}, evil, pickle_protocol=protocol)
        _one_line_refusal(plan_dir, evil, needle)
        assert not marker.exists()


def test_format1_checkpoint_read_safely_and_resumed(tmp_path: Path) -> None:
    """Format 1 held numpy/Python RNG states as pickled objects: still read, weights_only."""
    import random

    import numpy as np

    from hetsched.runtime.checkpoint import load_checkpoint, restore

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    np.random.seed(7)
    random.seed(7)
    old = {"format": 1, "step": 5, "sampler": {"epoch": 0, "offset": 10},
           "model": model.state_dict(), "optimizer": opt.state_dict(),
           "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                   "python": random.getstate(), "cuda": None}, "extra": {}}
    expect_np, expect_py = np.random.rand(), random.random()
    p = tmp_path / "v1.pt"
    torch.save(old, p)
    state = load_checkpoint(p)
    assert state is not None and state["step"] == 5
    restore(state, model=model, optimizer=opt)
    assert np.random.rand() == expect_np and random.random() == expect_py


def test_format2_roundtrip_restores_rng(tmp_path: Path) -> None:
    import random

    import numpy as np

    from hetsched.runtime.checkpoint import FORMAT, load_checkpoint, restore, save_checkpoint

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = tmp_path / "v2.pt"
    save_checkpoint(p, model=model, optimizer=opt, sampler={"epoch": 1}, step=3)
    expect = (np.random.rand(), random.random(), torch.rand(1).item())
    state = load_checkpoint(p)
    assert state is not None and state["format"] == FORMAT == 2
    restore(state, model=model, optimizer=opt)
    assert (np.random.rand(), random.random(), torch.rand(1).item()) == expect
