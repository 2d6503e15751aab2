"""The pool executor's critical-path overhead: wall time against the sum of its tasks' compute.

Method: the planner makes a pool plan (``hetsched plan --mode pool``) of the
built-in workloads (mlp, cnn, transformer; one task per round each, so no round
waits on another GPU; step times probed on this machine first, task size the
planner's default: a task lasts at least 0.5 s) on ``--gpus`` GPUs; ``hetsched exec`` runs it as executor
threads of one process (the real coordinator and TCP protocol), once in line
(``get`` and ``put`` on the critical path of every task, the executor before
this change) and once pipelined (the next task's parameters pulled while this
one computes, gradients pushed from another thread), each with parameters and
gradients over TCP (forced, ``HETSCHED_EXEC_TRANSPORT=tcp``) and through shared
memory (the executors are on the coordinator's node), alternating ``--repeats``
times. Per executor the report's ``executor`` record gives wall (first task's
pull to the last push acknowledged), the sum of its tasks' compute and the
critical-path overhead (per task: the time from the previous compute's end to
this compute's start). Target: wall / compute <= 1.05 pipelined.

Usage::

    python bench/bench_exec_overhead.py [--device cpu|cuda] [--gpus 1] [--tasks 1] [--repeats 2]
        [--task-iterations N] [--scale 8] [--transports tcp,shm] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MAIN = "import sys; from hetsched.cli.main import main; sys.argv[0] = 'hetsched'; main()"


def make_plan(tmp: Path, gpus: int, task_iterations: int | None, scale: int,
              device: str = "cpu", state: Path | None = None, rows_from: str = "probe",
              tasks: int = 1) -> Path:
    """The pool plan of the three built-in jobs, each with ``tasks`` tasks per round (with
    more than one, the probe also measures that many workers' synchronisation)."""
    jobs = (
        "jobs:\n"
        f"  - {{name: m, workload: mlp, dataset_size: {2048 * scale}, epochs: 1, "
        f"global_batch: 64, requested_gpus: {tasks}, memory_gb: 1}}\n"
        f"  - {{name: c, workload: cnn, dataset_size: {1024 * scale}, epochs: 1, "
        f"global_batch: 32, requested_gpus: {tasks}, memory_gb: 1}}\n"
        f"  - {{name: t, workload: transformer, dataset_size: {1024 * scale}, epochs: 1, "
        f"global_batch: 32, requested_gpus: {tasks}, memory_gb: 1}}\n")
    (tmp / "jobs.yaml").write_text(jobs)
    nodes = "\n".join(f"  - {{names: n{k + 1}, gpu_type: v100, gpus: 1, gpu_memory_gb: 16}}"
                      for k in range(gpus))
    (tmp / "cluster.yaml").write_text(f"name: b\nnodes:\n{nodes}\n")
    # the built-ins' step times on this machine, measured by the probe (one thread)
    from hetsched.runtime.probe import probe

    # ``rows_from="executor"``: the step time of a pool task's iteration as the executor
    # runs it (no optimizer step: the coordinator applies one per round);
    # ``"probe-whole"``: the rows of the last ``"probe"`` call without their optimizer
    # share (the profile as it was before the probe measured it apart)
    csv = tmp / {"probe": "tp.csv", "probe-whole": "tp-whole.csv"}.get(rows_from,
                                                                       "tp-executor.csv")
    if state is None and rows_from == "probe-whole" and csv.exists():
        pass  # written beside tp.csv from the same probes
    elif state is None:
        from dataclasses import replace

        from hetsched.io.profiles import write_csv

        rows = ["workload,gpu_type,local_batch,step_time_s"]
        probed = []
        for w, b in (("mlp", 64), ("cnn", 32), ("transformer", 32)):
            if rows_from == "executor":
                from hetsched.runtime.executor.iteration import iteration_time

                rows.append(f"{w},v100,{b // tasks},"
                            f"{iteration_time(w, b // tasks, device):.6f}")
                continue
            probed += probe(w, "v100", [b // tasks], device=device, sync=tasks > 1,
                            sync_gpus=(tasks,)).rows
        if probed:
            with open(csv, "w") as f:
                write_csv(probed, f)
            with open(tmp / "tp-whole.csv", "w") as f:
                write_csv([replace(r, optimizer_s=None) for r in probed], f)
        else:
            csv.write_text("\n".join(rows) + "\n")
    out = tmp / (f"pool-{rows_from}.json" if state is None else "pool-history.json")
    # with ``state``: the planner reads that profile history (step times and the
    # executor's measured per-task overhead) instead of the probed CSV
    tp = ["--throughputs", str(csv)] if state is None else []
    subprocess.run([sys.executable, "-c", MAIN, "plan", str(tmp / "jobs.yaml"), "--cluster",
                    str(tmp / "cluster.yaml"), *tp, "--mode",
                    "pool", *(["--task-iterations", str(task_iterations)] if task_iterations
                              else []), "--out", str(out)],
                   check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT),
                        **({"HETSCHED_STATE": str(state)} if state is not None else {})})
    return out


def predicted_vs_measured(plan: Path, rep: Path) -> dict[str, Any]:
    """Weighted JCT predicted by the plan and measured from the executors' reports, and per
    job the plan's task time against the measured compute + critical-path overhead."""
    from hetsched.io.plan_json import load_plan
    from hetsched.io.pool_reports import read_pool_reports
    from hetsched.io.reports import iter_records

    p = load_plan(plan)
    d = p.to_dict()
    pred = float((d.get("objective") or {}).get("weighted_jct_s", float("nan")))
    prog = read_pool_reports(rep, str(p.plan_id))
    t0 = min(float(t["start"]) for t in prog.tasks)
    weights = {j.name: float(j.spec.weight) if j.spec is not None else 1.0 for j in p.jobs}
    meas = sum(weights.get(n, 1.0) * (float(jp.end or 0.0) - t0)
               for n, jp in prog.jobs.items() if jp.done)
    planned: dict[str, list[float]] = {}
    sync: dict[str, list[float]] = {}
    for g in d["tasks"]["gpus"]:
        for run in g["runs"]:
            for row in run["tasks"] * int(run["repeat"]):
                planned.setdefault(str(row[0]), []).append(float(row[4]) - float(row[3]))
                sync.setdefault(str(row[0]), []).append(float(row[5]) - float(row[4]))
    files = sorted((rep / str(p.plan_id)).glob("gpu-*.jsonl"))
    tasks = [t for f in files for t in iter_records(f, "task")]
    ends = {str(r["job"]): float(r["end"]) for f in files for r in iter_records(f, "job_done")}
    jobs = {}
    for name in sorted(planned):
        ts = [t for t in tasks if t["job"] == name]
        last = max(int(t["round"]) for t in ts)
        last_end = max(float(t["end"]) for t in ts if int(t["round"]) == last)
        jobs[name] = {
            # after a task's compute: the plan's synchronisation, and the job's last round
            # as run (its end, all gradients in and stepped, less its last task's end)
            "planned_sync_s": statistics.median(sync[name]),
            "measured_last_sync_s": ends[name] - last_end if name in ends else None,
            "planned_task_s": statistics.median(planned[name]),
            "compute_s": statistics.median(float(t["compute_s"]) for t in ts),
            "overhead_s": statistics.median(float(t["overhead_s"]) for t in ts),
            "iterations": d["tasks"]["jobs"][name]["iterations_per_task"],
            "rounds": d["tasks"]["jobs"][name]["rounds"]}
    return {"predicted_s": pred, "measured_s": meas, "ratio": meas / pred if pred else None,
            "jobs": jobs}


def predict_loop(tmp: Path, a: Any) -> None:
    """Predicted vs measured weighted JCT of the same jobs planned five ways: from the
    probed step times (their optimizer share taken off a pool task's iteration); from the
    same rows without that share (the whole step, as the planner took it before the
    probe measured the share apart); from rows timed by the executor's own iteration
    (``iteration.iteration_time``: no optimizer step); from a profile history holding the
    probe rows plus the executors' reports of one run (each task's compute per iteration
    and its critical-path overhead folded in, as ``hetsched status`` does for a pool
    job); and from that history after a second run. The history runs come first; then
    the plans run ``--repeats`` times, alternating (so a change of load hits all
    alike), and the median measured/predicted of each is printed."""
    from hetsched.io.profiles import load_throughputs
    from hetsched.state.history import import_rows, ingest_reports
    from hetsched.state.store import open_store

    workloads = {"m": "mlp", "c": "cnn", "t": "transformer"}
    plans: dict[str, Path] = {}
    plans["executor iteration rows"] = make_plan(tmp, a.gpus, a.task_iterations, a.scale,
                                                 a.device, rows_from="executor",
                                                 tasks=a.tasks)
    plans["probe only"] = make_plan(tmp, a.gpus, a.task_iterations, a.scale, a.device,
                                    tasks=a.tasks)
    # the same probe rows, their optimizer share not taken off (the planner before)
    plans["probe, whole step"] = make_plan(tmp, a.gpus, a.task_iterations, a.scale,
                                           a.device, rows_from="probe-whole", tasks=a.tasks)
    state = tmp / "state.db"
    with open_store(state) as st:
        tab = load_throughputs(tmp / "tp.csv")
        import_rows(st, [r for rs in tab.rows.values() for r in rs], "probe")
    last = plans["probe only"]
    for k in range(1, a.predict + 1):
        rep = tmp / f"rep-history-{k}"
        run_once(last, rep, False, a.device)
        with open_store(state) as st:
            ingest_reports(st, sorted(rep.rglob("gpu-*.jsonl")), workloads=workloads)
        last = make_plan(tmp, a.gpus, a.task_iterations, a.scale, a.device, state=state,
                         tasks=a.tasks)
        dest = tmp / f"pool-history-{k}.json"
        last.replace(dest)
        plans[f"history after {k} run(s)"] = last = dest
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in plans}
    for k in range(a.repeats):
        for name, plan in plans.items():
            rep = tmp / f"rep-{k}-{name.replace(' ', '_')}"
            run_once(plan, rep, False, a.device)
            got[name].append(predicted_vs_measured(plan, rep))
    print(f"medians of {a.repeats} runs per plan (alternating)")
    for name, res in got.items():
        ratio = statistics.median(float(r["ratio"]) for r in res)
        print(f"{name:<26} predicted {res[0]['predicted_s']:.3f} s  measured "
              f"{statistics.median(r['measured_s'] for r in res):.3f} s  "
              f"measured/predicted {ratio:.3f} "
              f"(runs: {', '.join(format(r['ratio'], '.2f') for r in res)})")
        for job, j in res[0]["jobs"].items():
            comp = statistics.median(r["jobs"][job]["compute_s"] for r in res)
            ov = statistics.median(r["jobs"][job]["overhead_s"] for r in res)
            done = [r["jobs"][job]["measured_last_sync_s"] for r in res]
            msync = statistics.median(x for x in done if x is not None) if any(
                x is not None for x in done) else float("nan")
            print(f"    job {job} ({workloads[job]}): {j['rounds']} rounds of "
                  f"{j['iterations']} iterations; planned task {j['planned_task_s'] * 1e3:.1f}"
                  f" ms, measured compute {comp * 1e3:.1f} ms + overhead {ov * 1e3:.2f} ms; "
                  f"sync after a task planned {j['planned_sync_s'] * 1e3:.1f} ms, "
                  f"the last round's measured {msync * 1e3:.1f} ms")


def run_once(plan: Path, rep: Path, in_line: bool, device: str, transport: str = "auto"
             ) -> list[dict[str, Any]]:
    from hetsched.io.plan_json import load_plan
    from hetsched.io.reports import iter_records
    from hetsched.runtime.executor.entry import run_threads

    res = run_threads(str(plan), {"seed": 0, "report_dir": str(rep), "in_line": in_line,
                                  "transport": transport}, device=device)
    bad = [r for r in res if not isinstance(r, dict)]
    if bad:
        raise SystemExit(f"executor failed: {bad[0]}")
    pid = str(load_plan(plan).plan_id)
    out = []
    for f in sorted((rep / pid).glob("gpu-*.jsonl")):
        summ = list(iter_records(f, "executor"))[-1]
        tasks = list(iter_records(f, "task"))
        ov = sorted(t["overhead_s"] for t in tasks)
        summ["overhead_p50_ms"] = ov[len(ov) // 2] * 1e3
        summ["overhead_mean_ms"] = sum(ov) / len(ov) * 1e3 if ov else 0.0
        summ["via"] = ",".join(sorted({str(t.get("via", "tcp")) for t in tasks}))
        out.append(summ)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=1,
                    help="tasks per round of each job (--predict; at most --gpus)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--task-iterations", type=int, default=None,
                    help="default: the planner's (a task lasts >= 0.5 s on its profile)")
    ap.add_argument("--scale", type=int, default=8, help="multiplies the data sets")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--transports", default="tcp,shm",
                    help="tcp (forced) and/or shm (shared memory on this node), side by side")
    ap.add_argument("--predict", type=int, default=0, metavar="RUNS",
                    help="instead: predicted vs measured weighted JCT of plans from the "
                    "probe, from the executor's own iteration and from the history after "
                    "1..RUNS runs' reports")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    # the probe and the executors size their threads by cpu_threads(), which honours it
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    if a.predict:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"device {a.device}, {a.gpus} executor(s), task iterations "
                  f"{a.task_iterations or 'planner default'}, scale {a.scale}")
            predict_loop(Path(tmp), a)
        return
    modes = [(f"{m} {t}", m == "in line", t) for m in ("in line", "pipelined")
             for t in a.transports.split(",")]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in modes}
    with tempfile.TemporaryDirectory() as tmp:
        plan = make_plan(Path(tmp), a.gpus, a.task_iterations, a.scale, a.device)
        for k in range(a.repeats):  # the modes alternate, so a load change hits them alike
            for name, in_line, transport in modes:
                rep = Path(tmp) / f"rep-{name.replace(' ', '')}-{k}"
                rows[name] += run_once(plan, rep, in_line, a.device,
                                       "tcp" if transport == "tcp" else "auto")
    if a.json:
        print(json.dumps(rows, indent=1))
    print(f"device {a.device}, {a.gpus} executor(s), {a.repeats} runs per mode, "
          f"task iterations {a.task_iterations or 'planner default'}; medians over executors "
          "and runs")
    print("mode            via   tasks   wall s   compute s   wall/compute   overhead p50 ms"
          "   mean ms   stall s")
    for mode, rs in rows.items():
        med = {k: statistics.median(float(r[k]) for r in rs)
               for k in ("wall_s", "compute_s", "wall_over_compute", "overhead_p50_ms",
                         "overhead_mean_ms", "stall_s", "tasks")}
        via = ",".join(sorted({r["via"] for r in rs}))
        print(f"{mode:<15} {via:<5} {med['tasks']:>5.0f}   {med['wall_s']:>6.2f}   "
              f"{med['compute_s']:>9.2f}   {med['wall_over_compute']:>12.3f}   "
              f"{med['overhead_p50_ms']:>15.2f}   {med['overhead_mean_ms']:>7.2f}   "
              f"{med['stall_s']:>7.3f}")


if __name__ == "__main__":
    main()
