"""ONES (elastic batches) against fixed-batch policies, and rescale overhead.

Workloads: the first N jobs of Gavel's MSR trace (msr-seed0-0e4a51) on
Gavel's measured throughputs (examples/gavel_throughputs.csv), arrivals
compressed by --load so jobs overlap. Every job gets ``elastic: {min_batch:
B0/4, max_batch: 8*B0}`` (the trace's batch B0 is the user's) and a
per-workload gradient noise scale; a trace job (one pass of ``steps``
global batches) is split into 30 epochs of the same samples so ONES's
epoch-based rules apply. Policies: ``ones`` against ``optimus``, ``has``,
``jps`` and ``auto`` (fixed batches), each evaluated by the same evaluator:

* *plain scoring*: progress counted in samples (ONES's assumption that
  linear LR scaling keeps samples-to-converge constant);
* *efficiency scoring*: progress counted in efficient samples with the
  Pollux efficiency ``(B_noise + B0)/(B_noise + B)`` (docs/elastic.md).

Rescale overhead (``--overhead``): two local gloo ranks (CPU) change
shares in place (the ``rescale`` report's pause), against a
checkpoint-restart of the same change (stop, new processes, resume).

    python bench/bench_ones.py [--jobs 40] [--gpus 15] [--load 4] [--seeds 3] [--overhead]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
from gavel_data import TRACES  # noqa: E402

sys.path.insert(0, str(ROOT))

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.core.spec import Cluster, Node  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.io.specs import parse_jobs  # noqa: E402
from hetsched.io.traces import parse_trace  # noqa: E402
from hetsched.planning.planner import plan_problem  # noqa: E402
from hetsched.planning.space.evaluator import simulate  # noqa: E402
from hetsched.planning.space.policies.base import make_policy  # noqa: E402

TABLE = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
TRACE = TRACES / "msr-seed0-0e4a51.trace"
#: gradient noise scale per workload (orders of magnitude as McCandlish et al. report:
#: image classifiers ~1e3 samples, language models larger, recommendation small)
NOISE = {"resnet-18": 800.0, "resnet-50": 2000.0, "transformer": 4000.0, "lm": 6000.0,
         "recommendation": 20000.0}
FIXED = ("optimus", "has", "jps", "auto")
EPOCHS = 30


def cluster(k: int, types: tuple[str, ...] = ("v100", "p100", "k80")) -> Cluster:
    """k GPUs split evenly over ``types`` (the first takes the remainder), nodes of 4."""
    per = {t: k // len(types) + (k % len(types) if j == 0 else 0) for j, t in enumerate(types)}
    nodes = []
    for t, n in per.items():
        for j in range(0, n, 4):
            nodes.append(Node(f"{t}-{j // 4}", t, min(4, n - j)))
    return Cluster(tuple(nodes), name=f"gavel-{k}")


def jobs(n: int, load: float, elastic: bool) -> list[Any]:
    raw, _ = parse_trace(TRACE, limit=n)
    t0 = min(j["arrival_s"] for j in raw)
    for j in raw:
        gb = j["global_batch"]
        j["arrival_s"] = (j["arrival_s"] - t0) / load
        j["dataset_size"] = max(gb, j["dataset_size"] // EPOCHS)
        j["epochs"] = EPOCHS
        j.pop("requested_gpus", None)
        if elastic:
            j["elastic"] = {"min_batch": max(1, gb // 4), "max_batch": gb * 8,
                            "lr_scaling": "linear", "noise_scale": NOISE.get(j["workload"], 1e3)}
    return parse_jobs({"jobs": raw}, "trace")


def evaluate(n: int, k: int, load: float, seeds: int,
             types: tuple[str, ...] = ("v100", "p100", "k80")) -> dict[str, Any]:
    out: dict[str, Any] = {}
    fixed = PlanningProblem(jobs(n, load, False), cluster(k, types), TABLE)
    el = PlanningProblem(jobs(n, load, True), cluster(k, types), TABLE)
    for eff in (False, True):
        tag = "efficiency" if eff else "plain"
        rows: dict[str, Any] = {}
        for name in FIXED:
            t = time.perf_counter()
            if name == "auto":
                plan = plan_problem(fixed, "auto")
            else:
                plan = simulate(fixed, make_policy(name), restart_cost_s=60.0)
            rows[name] = {"avg_jct_s": plan.avg_jct_s, "makespan_s": plan.makespan_s,
                          "plan_s": time.perf_counter() - t}
        runs = []
        for seed in range(seeds):
            t = time.perf_counter()
            pol = make_policy("ones", {"seed": seed, "efficiency": eff})
            plan = simulate(el, pol, restart_cost_s=60.0, stat_efficiency=eff)
            runs.append({"avg_jct_s": plan.avg_jct_s, "makespan_s": plan.makespan_s,
                         "plan_s": time.perf_counter() - t,
                         "rescales": sum(1 for j in plan.jobs for a, b in
                                         zip(j.segments, j.segments[1:], strict=False)
                                         if a.workers == b.workers)})
        rows["ones"] = {k2: float(np.mean([r[k2] for r in runs])) for k2 in runs[0]}
        rows["ones"]["avg_jct_s_per_seed"] = [round(r["avg_jct_s"], 1) for r in runs]
        best = min(FIXED, key=lambda p: rows[p]["avg_jct_s"])
        rows["best_fixed"] = best
        rows["ones_vs_best_fixed"] = 1 - rows["ones"]["avg_jct_s"] / rows[best]["avg_jct_s"]
        # the default ones (keep_fixed): the paper's search above is kept only where it
        # beats the best fixed-batch plan (auto); with efficiency scoring through the
        # planner itself, with plain scoring (which the planner does not offer) the same rule
        kept = []
        for seed, r in enumerate(runs):
            if eff:
                plan = plan_problem(el, "ones", {"seed": seed}, restart_cost_s=60.0)
                kept.append((plan.avg_jct_s, plan.notes.fixed_start["kept"]))
            else:
                own = r["avg_jct_s"] < rows["auto"]["avg_jct_s"]
                kept.append((r["avg_jct_s"] if own else rows["auto"]["avg_jct_s"],
                             "own" if own else "fixed"))
        rows["ones_default"] = {"avg_jct_s": float(np.mean([k[0] for k in kept])),
                                "kept": [k[1] for k in kept]}
        rows["ones_default_vs_best_fixed"] = 1 - rows["ones_default"]["avg_jct_s"] / rows[
            best]["avg_jct_s"]
        out[tag] = rows
    return out


def overhead() -> dict[str, Any]:
    """In-place rescale pause vs checkpoint-restart on two local CPU ranks."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from rt_helpers import train_many

    from hetsched.io.reports import iter_records
    from hetsched.runtime.launcher import spawn_local
    from hetsched.runtime.trainer import TrainConfig

    env = {"OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cfg = TrainConfig(job="ip", workload="mlp", dataset_size=4000, epochs=1.0,
                          local_batches=[5, 3], report=str(tmp / "ip.jsonl"), device="cpu",
                          rescale_request=str(tmp / "ip.req"), report_every=1,
                          lr_scaling="linear", base_batch=8)
        spawn_local(2, train_many, ([cfg], None, (20, str(tmp / "ip.req"), [9, 7])),
                    extra_env=env, timeout_s=300)
        rec = next(iter_records(tmp / "ip.jsonl", "rescale"))
        steps = [r["step_s"] for r in iter_records(tmp / "ip.jsonl", "steps") if r["rank"] == 0]
        ck = str(tmp / "cr.pt")
        cr = TrainConfig(job="cr", workload="mlp", dataset_size=4000, epochs=1.0,
                         local_batches=[5, 3], report=str(tmp / "cr.jsonl"), device="cpu",
                         checkpoint=ck, max_steps=20, checkpoint_every=10_000)
        t0 = time.perf_counter()
        spawn_local(2, train_many, ([cr],), extra_env=env, timeout_s=300)
        t_stop = time.perf_counter()
        cr2 = TrainConfig(job="cr", workload="mlp", dataset_size=4000, epochs=1.0,
                          local_batches=[9, 7], report=str(tmp / "cr.jsonl"), device="cpu",
                          checkpoint=ck, max_steps=1)
        spawn_local(2, train_many, ([cr2],), extra_env=env, timeout_s=300)
        t_resumed = time.perf_counter()
        step1 = [r["step_s"] for r in iter_records(tmp / "cr.jsonl", "steps")
                 if r["rank"] == 0][-1]
    return {"in_place_pause_s": rec["pause_s"], "in_place_step_s": float(np.median(steps)),
            "checkpoint_restart_s": t_resumed - t_stop - step1,
            "first_run_s": t_stop - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--gpus", type=int, default=15)
    ap.add_argument("--load", type=float, default=4.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--types", default="v100,p100,k80",
                    help="GPU types the GPUs are split over (v100: a homogeneous cluster)")
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    types = tuple(t for t in a.types.split(",") if t)
    res: dict[str, Any] = {"machine": platform.platform(), "jobs": a.jobs, "gpus": a.gpus,
                           "load": a.load, "seeds": a.seeds, "types": list(types)}
    res["jct"] = evaluate(a.jobs, a.gpus, a.load, a.seeds, types)
    for tag, rows in res["jct"].items():
        print(f"[{tag}] {'policy':10s} {'avg JCT s':>12s} {'makespan s':>12s} {'plan s':>8s}")
        for p in (*FIXED, "ones"):
            r = rows[p]
            print(f"[{tag}] {p:10s} {r['avg_jct_s']:12.1f} {r['makespan_s']:12.1f} "
                  f"{r['plan_s']:8.2f}")
        print(f"[{tag}] ones vs best fixed ({rows['best_fixed']}): "
              f"{100 * rows['ones_vs_best_fixed']:.1f}% lower avg JCT (target >= 20%)")
        print(f"[{tag}] ones (default, keep_fixed) {rows['ones_default']['avg_jct_s']:.1f}: "
              f"{100 * rows['ones_default_vs_best_fixed']:.1f}% lower than the best fixed; "
              f"kept {rows['ones_default']['kept']}")
    if a.overhead:
        res["overhead"] = overhead()
        o = res["overhead"]
        print(f"rescale in place: pause {o['in_place_pause_s'] * 1000:.1f} ms (median step "
              f"{o['in_place_step_s'] * 1000:.1f} ms); checkpoint-restart "
              f"{o['checkpoint_restart_s']:.2f} s (target in place <= 0.5 s)")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
