"""auto's work model against the clock: counted work and CPU seconds of each candidate.

Run: python bench/bench_work_calibration.py [--out docs/bench_work_calibration.json]

auto admits a candidate by its predicted counted work (reference seconds,
planning/select.py) and never reads a clock, so the same input gives the same
plan. The constants that turn events, jobs, DP pairs and LPs into reference
seconds were measured on the 2-core bench machine. This bench checks them.
For each space-mode candidate on Gavel's traces (the bound bench's four
instances), two synthetic sizes and bench_pool's B (100 jobs on 160 GPUs, its
trace and batch loads, and the batch with every job its own model), it runs
``simulate``. It records the
counted work, the prediction auto would have made from the first candidate's
plan, and the CPU seconds. A ratio counted/CPU far above 1 means auto skips a
candidate it could afford; far below 1, it overruns its budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bounds import trace_problems  # noqa: E402
from bench_pool import mix_8_4_3, problem  # noqa: E402
from bench_scaling import scale_problem  # noqa: E402

from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.planning import registry  # noqa: E402
from hetsched.planning.space.evaluator import simulate  # noqa: E402

#: candidates predicted above this many reference seconds on an instance are not run there
MAX_PREDICTED_S = 600.0


def own_models(p: PlanningProblem) -> PlanningProblem:
    """``p`` with every job its own model to the planners (model sizes 0.1% apart): a
    user's batch of different models or batch sizes. HAS's and JPS's trim tables are kept
    per job model within a memory cap; with more models than fit, each event builds the
    rest again, which auto's count must see."""
    jobs = [dataclasses.replace(j, model_size_mb=(j.model_size_mb or 100.0) * (1 + 1e-3 * k))
            for k, j in enumerate(p.jobs)]
    return PlanningProblem(jobs, p.cluster, p.table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_work_calibration.json"))
    args = ap.parse_args()
    reg = registry.policies("space")
    names = registry.auto_candidates("space")
    problems = [(f"{n} ({p.S} jobs)", p) for n, p in trace_problems()]
    problems += [(f"synthetic {s}x{k}", scale_problem(s, k)) for s, k in ((50, 160), (200, 360))]
    problems += [(f"bench_pool B {load} (100x160)", problem(100, mix_8_4_3(160), load))
                 for load in ("trace", "batch")]
    problems.append(("bench_pool B batch, each job its own model (100x160)", own_models(
        problem(100, mix_8_4_3(160), "batch"))))
    rows = []
    for label, p in problems:
        first = simulate(p, reg[names[0]](), restart_cost_s=0.0)
        for name in names:
            cls = reg[name]
            pred = cls.predict_work(p, first.work[1], horizon_s=first.makespan_s)
            if not pred < MAX_PREDICTED_S:
                rows.append({"instance": label, "policy": name, "predicted": pred,
                             "skipped": "predicted work too large to run here"})
                continue
            c0 = time.process_time()
            plan = simulate(p, cls(), restart_cost_s=0.0)
            cpu = time.process_time() - c0
            rows.append({"instance": label, "policy": name, "predicted": round(pred, 3),
                         "counted": round(float(plan.work[0]), 3), "cpu_s": round(cpu, 3),
                         "counted_over_cpu": round(float(plan.work[0]) / max(cpu, 1e-9), 2),
                         "weighted_jct_s": plan.weighted_jct_s})
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(),
                                          "command": " ".join(["python", *sys.argv]),
                                          "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
