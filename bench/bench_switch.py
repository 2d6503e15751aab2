"""Benchmark task switching: (a) restart a process per task, (b) a warm process loading a
checkpoint, (c) the pool executor without and (d) with speculative residency.

Method: for each model (``mlp``; ``resnet50``: ResNet-50-sized, 25.6 M parameters;
``bert-base``: BERT-base-sized, 109 M parameters) a one-GPU pool plan alternates the
model's job M (2 tasks per round, 1 iteration of 1 sample each) with a small MLP job
X: ``M r0t0, X, M r0t1, X, M r1t0, ...``. A switch is "the end of the previous task
to the moment this task's first layer can run":

* (a) the previous process is gone; a fresh ``python`` starts, imports torch,
  builds the model, ``torch.load``\\ s a checkpoint, moves it to the device;
* (b) a long-lived process with the model built ``torch.load``\\ s the checkpoint
  and ``load_state_dict``\\ s + moves it;
* (c) ``hetsched exec`` (executor threads, real coordinator over TCP) with
  ``--no-residency``: every task reloads M layer by layer from pinned host memory;
* (d) the same with the plan's speculative memory plan: M stays resident; the
  second task of a round moves nothing, the first refreshes the resident copy
  in place.

For (c)/(d) the executor's own ``switch_s`` (cleanup after the previous task +
load up to the first layer) is reported, and beside it ``+pull``: plus the time
to pull the parameters from the job's parameter server (what (a)/(b) get from
the checkpoint file). Share = switch / (switch + task compute). On CUDA also:
the H2D floor (model bytes / measured pinned bandwidth) and a zeroing check
(after an evicted job's task and the scrub, a fresh allocation over the freed
blocks reads only zeros).

Usage::

    python bench/bench_switch.py [--device cpu|cuda] [--models mlp,resnet50,bert-base]
                                 [--restarts 3] [--rounds 6] [--transports tcp,shm] [--json]

``--restarts 0`` leaves out (a) and (b). The executor modes run once per
transport (``tcp``: forced, ``shm``: shared memory on this node), side by side;
the main table is the first transport's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hetsched.runtime import workloads  # noqa: E402

#: small inputs so a CPU task stays short; the parameter count is the full model's
BUILD = {"mlp": lambda n, s: workloads.mlp(n, s),
         "resnet50": lambda n, s: workloads.resnet50(n, s, image=32),
         "bert-base": lambda n, s: workloads.bert_base(n, s, seq=16)}


def mlp_wl(dataset_size: int = 16, seed: int = 0) -> workloads.Workload:
    return BUILD["mlp"](dataset_size, seed)


def resnet50_wl(dataset_size: int = 16, seed: int = 0) -> workloads.Workload:
    return BUILD["resnet50"](dataset_size, seed)


def bert_wl(dataset_size: int = 16, seed: int = 0) -> workloads.Workload:
    return BUILD["bert-base"](dataset_size, seed)


ENTRY = {"mlp": "bench_switch:mlp_wl", "resnet50": "bench_switch:resnet50_wl",
         "bert-base": "bench_switch:bert_wl"}


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


# -- (a), (b) -------------------------------------------------------------------------

RESTART = """
import sys, time, torch
sys.path[:0] = [{root!r}, {bench!r}]
from bench_switch import BUILD
dev = torch.device({dev!r})
if dev.type == "cuda":
    torch.randn(1, device=dev)
m = BUILD[{model!r}](1, 0).model
m.load_state_dict(torch.load({ckpt!r}, map_location="cpu", weights_only=True))
m.to(dev)
if dev.type == "cuda":
    torch.cuda.synchronize(dev)
print(time.time())
"""


def restart_switch(model: str, ckpt: Path, dev: torch.device, n: int) -> list[float]:
    """(a): process start, torch import, model build, checkpoint load, move to device."""
    code = RESTART.format(root=str(ROOT), bench=str(Path(__file__).parent), dev=str(dev),
                          model=model, ckpt=str(ckpt))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = []
    for _ in range(n):
        t0 = time.time()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True)
        out.append(float(r.stdout.strip().splitlines()[-1]) - t0)
    return out


def warm_switch(model: str, ckpt: Path, dev: torch.device, n: int) -> list[float]:
    """(b): a live process with the model built loads the checkpoint and moves it."""
    m = BUILD[model](1, 0).model
    out = []
    for _ in range(n):
        m.to("cpu")
        sync(dev)
        t0 = time.perf_counter()
        m.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True))
        m.to(dev)
        sync(dev)
        out.append(time.perf_counter() - t0)
    return out


# -- (c), (d) -------------------------------------------------------------------------

def alternating_plan(tmp: Path, model: str, rounds: int) -> Path:
    """A one-GPU pool plan: M r t0, X, M r t1, X, ... (made by the planner, then its task
    sequence rewritten to this pattern; every model fits, so the memory plan keeps all)."""
    jobs = (f"jobs:\n  - {{name: M, workload: m, entrypoint: '{ENTRY[model]}', "
            f"dataset_size: {2 * rounds}, epochs: 1, global_batch: 2, requested_gpus: 2, "
            f"memory_gb: 1}}\n  - {{name: X, workload: x, entrypoint: '{ENTRY['mlp']}', "
            f"dataset_size: {2 * rounds}, epochs: 1, global_batch: 1, memory_gb: 1}}\n")
    (tmp / "jobs.yaml").write_text(jobs)
    (tmp / "cluster.yaml").write_text(
        "name: b\nnodes:\n  - {names: n1, gpu_type: v100, gpus: 1, gpu_memory_gb: 80}\n")
    (tmp / "tp.csv").write_text("workload,gpu_type,local_batch,step_time_s\n" + "".join(
        f"{w},v100,{b},{0.01 * b}\n" for w in ("m", "x") for b in (1, 2)))
    out = tmp / "plan.json"
    main = "import sys; from hetsched.cli.main import main; sys.argv[0] = 'hetsched'; main()"
    subprocess.run([sys.executable, "-c", main, "plan", str(tmp / "jobs.yaml"), "--cluster",
                    str(tmp / "cluster.yaml"), "--throughputs", str(tmp / "tp.csv"), "--mode",
                    "pool", "--task-iterations", "1", "--out", str(out)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    d = json.loads(out.read_text())
    t = d["tasks"]
    t["jobs"]["M"].update(tasks_per_round=2, rounds=rounds, iterations_per_task=1,
                          last_round_iterations=1, local_batch=1)
    t["jobs"]["X"].update(tasks_per_round=1, rounds=2 * rounds, iterations_per_task=1,
                          last_round_iterations=1, local_batch=1)
    rows = []
    for r in range(rounds):
        for k, row in enumerate((["M", r, 0], ["X", 2 * r, 0], ["M", r, 1], ["X", 2 * r + 1, 0])):
            s = float(4 * r + k)
            rows.append(row + [s, s + 1, s + 1, "keep", []])
    t["gpus"] = [{**t["gpus"][0], "tasks": len(rows), "runs": [{"repeat": 1, "tasks": rows}]}]
    t["total_tasks"] = t["stored_rows"] = len(rows)
    out.write_text(json.dumps(d))
    return out


def executor_switch(plan: Path, residency: bool, device: str, transport: str = "auto"
                    ) -> list[dict[str, Any]]:
    from hetsched.runtime.executor.entry import run_threads

    seen: list[dict[str, Any]] = []
    res = run_threads(str(plan), {"seed": 0, "residency": residency, "on_task": seen.append,
                                  "transport": transport}, device=device)
    bad = [r for r in res if not isinstance(r, dict)]
    if bad:
        raise RuntimeError(f"executor failed: {bad[0]}")
    m = [r for r in seen if r["job"] == "M"]
    return m[2:]  # the first round pays the cold start (first allocation) in both modes


# -- GPU only ---------------------------------------------------------------------------

def h2d_floor(nbytes: int, dev: torch.device) -> dict[str, float]:
    """Model bytes over the measured pinned host-to-device bandwidth."""
    n = 256 * 2**20
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    d.copy_(host, non_blocking=True)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(5):
        d.copy_(host, non_blocking=True)
    sync(dev)
    bw = 5 * n / (time.perf_counter() - t0)
    return {"pinned_GBps": bw / 1e9, "floor_ms": nbytes / bw * 1e3}


def _probe_free_blocks(dev: torch.device) -> tuple[int, int]:
    """Allocate a tensor over every free cached block; (bytes probed, bytes not zero)."""
    sizes = sorted((int(b["size"]) for seg in torch.cuda.memory_snapshot()
                    for b in seg.get("blocks", []) if b.get("state") == "inactive"),
                   reverse=True)
    probes = [torch.empty(s, dtype=torch.uint8, device=dev) for s in sizes]
    bad = sum(int((p != 0).sum()) for p in probes)
    return sum(sizes), bad


def _dirty_task(model: str, dev: torch.device) -> Any:
    """One task of ``model`` on ``dev`` (activations and gradients freed), evicted."""
    from hetsched.runtime.executor.slots import JobSlot

    wl = BUILD[model](4, 0)
    slot = JobSlot(wl.model, dev)
    slot.load(0)
    x, y = wl.dataset[:2]  # type: ignore[index]
    slot.collect = True
    wl.loss_fn(slot.model(x.to(dev)), y.to(dev)).backward()
    slot.finish_gradients()
    slot.evict()
    return slot


def zeroing_check(model: str, dev: torch.device) -> dict[str, Any]:
    """After a task, allocate over the freed blocks: without the scrub (control: the
    check can fail) and with it (what the executor does before another job's task)."""
    from hetsched.runtime.executor.slots import scrub_free_memory

    torch.cuda.empty_cache()
    _dirty_task(model, dev)
    probed0, dirty0 = _probe_free_blocks(dev)
    torch.cuda.empty_cache()
    _dirty_task(model, dev)
    zeroed = scrub_free_memory(dev)
    probed1, dirty1 = _probe_free_blocks(dev)
    return {"control_probed_MB": round(probed0 / 2**20, 1), "control_nonzero_B": dirty0,
            "scrubbed_MB": round(zeroed / 2**20, 1), "probed_MB": round(probed1 / 2**20, 1),
            "nonzero_B": dirty1}


# -- driver -----------------------------------------------------------------------------

def one_model(model: str, dev: torch.device, restarts: int, rounds: int, tmp: Path,
              transports: tuple[str, ...] = ("tcp", "shm")) -> dict[str, Any]:
    m = BUILD[model](1, 0).model
    nbytes = sum(p.numel() * p.element_size() for p in m.parameters())
    ckpt = tmp / f"{model}.pt"
    torch.save(m.state_dict(), ckpt)
    row: dict[str, Any] = {"model": model, "params_M": nbytes / 4e6, "MB": nbytes / 2**20}
    row["a"] = restart_switch(model, ckpt, dev, restarts) if restarts else []
    row["b"] = warm_switch(model, ckpt, dev, max(restarts, 5)) if restarts else []
    (tmp / model).mkdir()
    plan = alternating_plan(tmp / model, model, rounds)
    row["by_transport"] = {}
    for tr in transports:  # the first one fills the main table; each its overhead row
        for key, res in (("c", False), ("d", True)):
            recs = executor_switch(plan, res, dev.type, "tcp" if tr == "tcp" else "auto")
            # the device's idle time between the previous task's compute and this one's
            for task in (0, 1):  # task 0 waits for its job's last round (push, step, pull)
                rs = [r for r in recs if r["task"] == task]
                row["by_transport"][f"{key} {tr} t{task}"] = {
                    "overhead": [r["overhead_s"] for r in rs],
                    "wait": [r["wait_s"] for r in rs],
                    "via": sorted({str(r.get("via", "tcp")) for r in rs})}
            if tr != transports[0]:
                continue
            row[key] = [r["switch_s"] for r in recs]
            row[key + "_pull"] = [r["switch_s"] + r["wait_s"] for r in recs]
            row[key + "_share"] = [r["switch_s"] / (r["switch_s"] + r["compute_s"])
                                   for r in recs]
            row[key + "_task"] = [r["compute_s"] for r in recs]
            row[key + "_overhead"] = [r["overhead_s"] for r in recs]
    if dev.type == "cuda":
        row["h2d"] = h2d_floor(nbytes, dev)
        row["zeroing"] = zeroing_check(model, dev)
    return row


def ms(xs: list[float], q: float) -> str:
    return f"{pct(xs, q) * 1e3:.3g}" if xs else "-"


def report(rows: list[dict[str, Any]], dev: torch.device) -> None:
    print(f"device: {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'})"
          f", torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("switch time p50 / p99 in ms; share = switch / (switch + task compute), p50; "
          "overhead = the device's idle time from the previous compute to this one, p50 "
          "(the pull of the parameters overlapped with the previous task)")
    hdr = ("model", "MB", "(a) restart", "(b) warm load", "(c) exec", "(c)+pull", "(c) share",
           "(d) exec+resid", "(d)+pull", "(d) share", "(c)/(d) overhead", "task ms")
    print(" | ".join(hdr))
    for r in rows:
        cells = [r["model"], f"{r['MB']:.0f}", f"{ms(r['a'], 50)} / {ms(r['a'], 99)}",
                 f"{ms(r['b'], 50)} / {ms(r['b'], 99)}", f"{ms(r['c'], 50)} / {ms(r['c'], 99)}",
                 f"{ms(r['c_pull'], 50)}", f"{pct(r['c_share'], 50):.2%}",
                 f"{ms(r['d'], 50)} / {ms(r['d'], 99)}", f"{ms(r['d_pull'], 50)}",
                 f"{pct(r['d_share'], 50):.2%}",
                 f"{ms(r['c_overhead'], 50)} / {ms(r['d_overhead'], 50)}", ms(r["d_task"], 50)]
        print(" | ".join(cells))
    print("critical-path overhead by transport (same run): p50 / max ms, and the wait for "
          "the parameters p50 ms; (c) no residency, (d) residency; t0: the round's first "
          "task (waits for the job's previous round: its push, the optimizer step, the "
          "pull), t1: the second (a pull of the same version, or nothing when resident)")
    for r in rows:
        for name, v in r["by_transport"].items():
            print(f"{r['model']:<10} {name:<10} via {','.join(v['via']):<4} overhead "
                  f"{ms(v['overhead'], 50)} / {ms(v['overhead'], 100)}   wait "
                  f"{ms(v['wait'], 50)}")
    for r in rows:
        if "h2d" in r:
            print(f"{r['model']}: H2D floor {r['h2d']['floor_ms']:.3g} ms at "
                  f"{r['h2d']['pinned_GBps']:.1f} GB/s pinned; zeroing {r['zeroing']}")
    if dev.type != "cuda":
        print("GPU rows (H2D floor, zeroing check): unmeasured on CPU; run "
              "`python bench/bench_switch.py --device cuda` on a GPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--models", default="mlp,resnet50,bert-base")
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--transports", default="tcp,shm",
                    help="executor transports run side by side: tcp (forced), shm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        torch.randn(1, device=dev)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [one_model(m, dev, args.restarts, args.rounds, Path(tmp),
                          tuple(args.transports.split(",")))
                for m in args.models.split(",")]
    if args.json:
        print(json.dumps(rows, indent=1))
    report(rows, dev)


if __name__ == "__main__":
    main()
