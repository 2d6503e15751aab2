"""One GPU check anyone can run: the runtime's GPU-facing figures in one table.

``make gpu-check`` (or ``python bench/gpu_check.py``) runs, on one device:

1. **probe vs run**: the probe's step time against ``hetsched run``'s
   steady-state mean step, per built-in workload at two batch sizes, side by
   side in one process (``bench_probe_vs_run.py``); target run / probe in 0.9-1.1;
2. **switch**: the pool executor's task switch and its critical-path overhead
   (the device's idle time between two computes) for ResNet-50- and
   BERT-base-sized models, with and without residency (``bench_switch.py``);
   on a GPU beside the pinned host-to-device floor of the model's bytes;
   target overhead p50 <= max(3 ms, 1.5x that floor); split by task: a round's
   first task (waits for the previous round's update) and its second (the version
   is there already), with the host parameter server's update timed alone;
3. **zeroing**: after a ResNet-50 task, freed device memory reads zero with
   the executor's scrub (and non-zero without it: the control) -- GPU only;
4. **pool plan**: a pool plan of the built-ins (step times probed here) predicted
   vs measured weighted JCT, and the executor's wall / compute (target <= 1.05);
5. **co-location**: a group of two built-in jobs on the device against each job
   alone: parameters (max difference, with torch's deterministic kernels in both)
   and wall.

Each check runs in a process (and process group) of its own with a time limit
(``LIMITS``, 60-240 s; ``--limit-s`` sets one for all): a check that hangs or
overruns is killed, its row says so, and the next one runs. It prints one table
(check, measured, target or reference, verdict), and streams each row to stderr
(``row: [JSON]``) as it is measured, so a log keeps what a cut-off run measured. On CPU
(``--device cpu``) the same checks run at small sizes; the zeroing row says
"unmeasured (CPU)". Meant to finish within 5 minutes on one GPU.

Usage::

    python bench/gpu_check.py [--device cuda|cpu] [--only probe,switch,...] [--limit-s S]
                              [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

Row = tuple[str, str, str, str]  # check, measured, target / reference, verdict


def verdict(ok: bool | None) -> str:
    return "unmeasured" if ok is None else ("ok" if ok else "MISSED")


def emit(rows: list[Row]) -> None:
    """Each row to stderr (``row: [JSON]``) as soon as it is measured: a check cut off by
    its time limit still leaves what it measured."""
    for r in rows:
        print("row:", json.dumps(list(r)), file=sys.stderr, flush=True)


def probe_vs_run(dev: str) -> list[Row]:
    from bench_probe_vs_run import one

    cases = ([("mlp", 128), ("mlp", 512), ("cnn", 128), ("cnn", 512), ("transformer", 128),
              ("transformer", 512), ("resnet50", 32), ("resnet50", 128)] if dev == "cuda"
             else [("mlp", 16), ("mlp", 64), ("cnn", 16), ("cnn", 64), ("transformer", 16),
                   ("transformer", 64)])
    rows = []
    for w, b in cases:
        r = one(w, b, 100, 3, dev, 1)
        rows.append((f"probe vs run: {w} b={b}",
                     f"probe {r['probe'] * 1e3:.3g} ms, run {r['run'] * 1e3:.3g} ms, "
                     f"ratio {r['ratio']:.3f}", "run/probe 0.90-1.10",
                     verdict(0.9 <= r["ratio"] <= 1.1)))
        emit(rows[-1:])
    return rows


def switch(dev: str, tmp: Path) -> list[Row]:
    import torch
    from bench_switch import alternating_plan, executor_switch, h2d_floor, pct

    from hetsched.runtime import workloads

    models = ["resnet50", "bert-base"] if dev == "cuda" else ["mlp", "resnet50"]
    rows = []
    for m in models:
        d = tmp / f"switch-{m}"
        d.mkdir()
        plan = alternating_plan(d, m, 4 if dev == "cuda" else 3)
        build = {"mlp": workloads.mlp, "resnet50": workloads.resnet50,
                 "bert-base": workloads.bert_base}[m]
        nbytes = sum(p.numel() * 4 for p in build(1, 0).model.parameters())
        floor = h2d_floor(nbytes, torch.device("cuda", 0)) if dev == "cuda" else None
        for res in (True, False):
            recs = executor_switch(plan, res, dev)
            sw = pct([r["switch_s"] for r in recs], 50) * 1e3
            ov = pct([r["overhead_s"] for r in recs], 50) * 1e3
            # what is not resident moves: all of it without residency, the refresh with it
            moved = [r["bytes_in"] for r in recs]
            target = None
            if floor is not None:
                f_ms = floor["floor_ms"] * statistics.median(moved) / max(nbytes, 1)
                target = max(3.0, 1.5 * f_ms)
            rows.append((f"switch: {m}, {'residency' if res else 'no residency'}",
                         f"switch p50 {sw:.3g} ms, overhead p50 {ov:.3g} ms",
                         f"overhead <= {target:.3g} ms" if target is not None else
                         "overhead: GPU target (max(3 ms, 1.5x H2D floor))",
                         verdict(ov <= target if target is not None else None)))
            rows.append(split_row(m, res, recs))
        rows.append(host_update_row(m, build(1, 0)))
        if floor is not None:
            rows.append((f"H2D floor: {m}", f"{floor['floor_ms']:.3g} ms at "
                         f"{floor['pinned_GBps']:.1f} GB/s pinned", "", ""))
    return rows


def split_row(model: str, residency: bool, recs: list[dict]) -> Row:
    """Where a switch's overhead goes: M's first task of a round needs the version the
    previous round's update made (its wait holds the gradient push, the parameter
    server's update and the pull); its second task needs the version already there."""
    from bench_switch import pct

    def part(rs: list[dict], key: str) -> str:
        return f"{pct([r[key] for r in rs], 50) * 1e3:.3g}" if rs else "-"

    new = [r for r in recs if r["task"] == 0]
    same = [r for r in recs if r["task"] != 0]
    return (f"  split: {model}, {'residency' if residency else 'no residency'}",
            f"new version: overhead p50 {part(new, 'overhead_s')} ms (wait {part(new, 'wait_s')}"
            f"); same version: overhead p50 {part(same, 'overhead_s')} ms (wait "
            f"{part(same, 'wait_s')})", "where the overhead goes (no target)", "")


def host_update_row(model: str, wl: object) -> Row:
    """The parameter server's work per round on this host, timed alone: check and add one
    contribution, the optimizer's step, clear the sum (what a round's last task waits for)."""
    import torch

    from hetsched.runtime.executor import state

    m = wl.model  # type: ignore[attr-defined]
    flat, _ = state.flatten_params(m)
    grad = torch.zeros_like(flat)
    state.attach_grads(m, grad)
    opt = wl.optimizer(m.parameters())  # type: ignore[attr-defined]
    c = torch.full_like(flat, 1e-6)

    def once() -> None:
        float(c.sum())
        grad.add_(c)
        opt.step()
        grad.zero_()

    once()
    t0 = time.perf_counter()
    for _ in range(5):
        once()
    ms = (time.perf_counter() - t0) / 5 * 1e3
    return (f"  host update: {model}", f"{ms:.3g} ms per round (torch threads "
            f"{torch.get_num_threads()}, {flat.numel() * 4 / 2**20:.0f} MB)", "the server's part of a new "
            "version's wait (no target)", "")


def zeroing(dev: str) -> list[Row]:
    if dev != "cuda":
        return [("zeroing after a ResNet-50 task", "unmeasured (CPU)",
                 "0 non-zero bytes with the scrub", verdict(None))]
    import torch
    from bench_switch import zeroing_check

    z = zeroing_check("resnet50", torch.device("cuda", 0))
    return [("zeroing after a ResNet-50 task",
             f"control {z['control_nonzero_B']} B non-zero; scrubbed {z['scrubbed_MB']} MB, "
             f"{z['nonzero_B']} B non-zero", "0 B with the scrub (control > 0)",
             verdict(z["nonzero_B"] == 0 and z["control_nonzero_B"] > 0))]


def pool_plan(dev: str, tmp: Path) -> list[Row]:
    from bench_exec_overhead import make_plan, run_once

    from hetsched.io.plan_json import load_plan
    from hetsched.io.pool_reports import read_pool_reports

    d = tmp / "pool"
    d.mkdir()
    plan = make_plan(d, 1, None, 16 if dev == "cuda" else 8, dev)
    summ = run_once(plan, d / "rep", False, dev)
    p = load_plan(plan)
    pred = float((p.to_dict().get("objective") or {}).get("weighted_jct_s", float("nan")))
    prog = read_pool_reports(d / "rep", str(p.plan_id))
    t0 = min(float(t["start"]) for t in prog.tasks)
    weights = {j.name: float(j.spec.weight) if j.spec is not None else 1.0 for j in p.jobs}
    meas = sum(weights.get(n, 1.0) * (float(jp.end or 0.0) - t0)
               for n, jp in prog.jobs.items() if jp.done)
    ratio = meas / pred if pred > 0 else float("nan")
    woc = max(float(s["wall_over_compute"]) for s in summ)
    ov = statistics.median(float(s["overhead_p50_ms"]) for s in summ)
    return [("pool plan of the built-ins: weighted JCT",
             f"predicted {pred:.3g} s, measured {meas:.3g} s, ratio {ratio:.3f}",
             "measured/predicted 0.90-1.10", verdict(0.9 <= ratio <= 1.1)),
            ("pool plan: executor wall / compute",
             f"{woc:.3f} (overhead p50 {ov:.3g} ms)", "<= 1.05", verdict(woc <= 1.05))]


def deterministic(target: Callable[..., object], *args: object) -> object:
    """``target(*args)`` with torch's deterministic kernels (a spawned process's entry):
    on a GPU, cuDNN's and cuBLAS's fastest kernels may add in any order, so two runs of
    the same job differ in the last bits, which 40 steps of SGD make visible."""
    import torch

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    return target(*args)


def colocation(dev: str, tmp: Path) -> list[Row]:
    import torch
    from group_helpers import group_job, group_plan, write_plan

    from hetsched.core.spec import Job
    from hetsched.io.reports import iter_records
    from hetsched.runtime.job import (
        _local_group_main,
        _local_rank_main,
        build_config,
        build_group_config,
    )
    from hetsched.runtime.launcher import spawn_local

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
    steps = 40 if dev == "cuda" else 15
    jobs = (("a", "cnn", 64 if dev == "cuda" else 16), ("b", "mlp", 128 if dev == "cuda" else 16))
    d = tmp / "group"
    d.mkdir()
    walls: dict[str, float] = {}
    for name, w, b in jobs:
        spec = Job(name=name, workload=w, dataset_size=steps * b, epochs=1, global_batch=b)
        cfg = build_config(spec, [{"gpu_type": "v100", "node": "n1", "local_batch": b}], 1,
                           name, {}, {"device": dev, "checkpoint": str(d / f"{name}.pt"),
                                      "report": str(d / f"{name}.jsonl"),
                                      "save_params": str(d / f"alone-{name}.pt"),
                                      "checkpoint_every": 10_000})
        if spawn_local(1, deterministic, (_local_rank_main, cfg), timeout_s=600) != [0]:
            raise RuntimeError(f"alone run of {name} failed")
        walls[name] = float(next(iter_records(d / f"{name}.jsonl", "done"))["time_s"])
    plan = write_plan(group_plan([group_job(n, w, (b,), dataset_size=steps * b,
                                            slots=(("n1", "v100", 0),)) for n, w, b in jobs]),
                      d / "plan.json")
    os.environ["HETSCHED_CHECKPOINT_DIR"] = str(d / "gck")
    os.environ["HETSCHED_REPORT_DIR"] = str(d / "grep")
    gcfg = build_group_config(str(plan), "g1", None, dict(os.environ),
                              {"device": dev, "checkpoint_every": 10_000,
                               "save_params_dir": str(d / "gp")})
    (d / "gp").mkdir()
    if spawn_local(1, deterministic, (_local_group_main, gcfg), timeout_s=600) != [0]:
        raise RuntimeError("group run failed")
    gwall = max(float(r["time_s"]) for n, _, _ in jobs
                for r in iter_records(next((d / "grep").rglob(f"{n}.jsonl")), "done"))
    diff = 0.0
    for n, _, _ in jobs:
        a = torch.load(d / f"alone-{n}.pt", weights_only=True)
        g = torch.load(d / "gp" / f"{n}.pt", weights_only=True)
        diff = max(diff, max(float((a[k] - g[k]).abs().max()) for k in a))
    serial = sum(walls.values())
    return [("co-location: parameters vs each job alone (deterministic kernels)",
             f"max |difference| {diff:.3g}",
             "<= 1e-5", verdict(diff <= 1e-5)),
            ("co-location: group wall vs jobs alone one after the other",
             f"group {gwall:.3g} s, alone {' + '.join(f'{v:.3g}' for v in walls.values())} = "
             f"{serial:.3g} s ({gwall / serial:.2f}x)", "reference (no target)", "")]


#: seconds each check may run, in a process of its own (sized for one GPU; --limit-s)
LIMITS = {"probe": 240.0, "switch": 120.0, "zeroing": 60.0, "pool": 120.0, "group": 120.0}


def run_check(key: str, dev: str, limit: float) -> list[Row]:
    """One check in a process (and process group) of its own, killed after ``limit``
    seconds: its stderr is relayed as it comes and its rows are read from it, so a check
    that hangs or overruns costs its own time only and keeps the rows it measured."""
    proc = subprocess.Popen([sys.executable, __file__, "--device", dev, "--only", key,
                             "--in-process"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    cut: list[bool] = []

    def stop() -> None:
        cut.append(True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(limit, stop)
    timer.start()
    rows: list[Row] = []
    assert proc.stderr is not None
    for line in proc.stderr:  # relayed, rows too: a caller's log keeps them
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.startswith("row: "):
            got = json.loads(line[5:])
            rows.append((str(got[0]), str(got[1]), str(got[2]), str(got[3])))
    rc = proc.wait()
    timer.cancel()
    end: list[Row] = []
    if cut:
        end = [(key, f"cut off at its time limit ({limit:g} s), {len(rows)} rows before",
                "", "unmeasured")]
    elif rc != 0 and not rows:
        end = [(key, f"its process exited {rc}", "", "FAILED")]
    emit(end)
    return rows + end


def in_process(keys: list[str], dev: str) -> list[Row]:
    """The checks ``keys`` in this process, one after another (each failure one row)."""
    import torch

    if dev == "cuda":
        torch.cuda.set_device(0)
    else:
        # the probe, the runs and the executors size their threads by cpu_threads(),
        # which honours it (two OpenMP threads on a shared two-core VM stall at barriers)
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        checks: dict[str, Callable[[], list[Row]]] = {
            "probe": lambda: probe_vs_run(dev), "switch": lambda: switch(dev, tmp),
            "zeroing": lambda: zeroing(dev), "pool": lambda: pool_plan(dev, tmp),
            "group": lambda: colocation(dev, tmp)}
        for key in keys:
            t0 = time.perf_counter()
            try:
                got = checks[key]()
                rows += got
                if key != "probe":  # the probe's rows are emitted as they come
                    emit(got)
            except Exception as e:  # noqa: BLE001  (one failed check is one row)
                traceback.print_exc(file=sys.stderr)
                rows.append((key, f"failed: {type(e).__name__}: {e}", "", "FAILED"))
                emit(rows[-1:])
            print(f"[{key}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda when torch sees a GPU")
    ap.add_argument("--only", default="probe,switch,zeroing,pool,group")
    ap.add_argument("--limit-s", type=float, default=None,
                    help="every check's time limit (default: per check, 60-240 s)")
    ap.add_argument("--in-process", action="store_true",
                    help="run the checks in this process, without time limits")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import torch

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: --device cuda, but torch sees no GPU")
    name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU"
    keys = a.only.split(",")
    unknown = [k for k in keys if k not in LIMITS]
    if unknown:
        raise SystemExit(f"gpu_check: --only: unknown check {unknown[0]!r}; "
                         f"valid: {', '.join(LIMITS)}")
    t_start = time.perf_counter()
    if a.in_process:
        rows = in_process(keys, dev)
    else:
        rows = [r for key in keys
                for r in run_check(key, dev, a.limit_s or LIMITS[key])]
    total = time.perf_counter() - t_start
    if a.json:
        print(json.dumps({"device": name, "torch": torch.__version__, "seconds": total,
                          "rows": rows}, indent=1))
        return
    print(f"gpu_check on {name} ({dev}), torch {torch.__version__}, {total:.0f} s")
    w = [max(len(r[k]) for r in rows + [("check", "measured", "target", "verdict")])
         for k in range(4)]
    for r in [("check", "measured", "target / reference", "verdict")] + rows:
        print(" | ".join(c.ljust(w[k]) for k, c in enumerate(r)))


if __name__ == "__main__":
    main()
