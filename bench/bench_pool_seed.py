"""Pool mode's space seed without the joint LP bound: CPU before and after, one run.

Run: python bench/bench_pool_seed.py [--out docs/bench_pool_seed.json]

``--mode pool`` plans space mode's ``auto`` first (Hare starts from that plan). That
plan's evaluator computed the space lower bound, joint LP included; in pool mode the LP
value is only reported (a task plan is bounded by the pool relaxation and each job
alone), and on a sweep it was most of pool mode's time. Now pool mode alone skips it
(``Estimates.joint_lp``). For each instance, side by side in one process: *with LP*
solves the space bound first, as before (``lower_bound_info``, then ``plan_pool``: the
memoised bound is reused); *without* is ``plan_pool`` as it runs now. Both plans must be
the same (weighted JCT, bound, tasks). Instances: bench_bounds.py's sweeps (30
single-GPU jobs on 16 Gavel GPUs) and Gavel traces (19-175 jobs on 36 GPUs).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_bounds import sweep_problems, trace_problems  # noqa: E402

from hetsched.planning.bounds import lower_bound_info  # noqa: E402
from hetsched.planning.pool import plan_pool  # noqa: E402


def _cpu(f):  # type: ignore[no-untyped-def]
    c0 = time.process_time()
    r = f()
    return r, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_pool_seed.json"))
    ap.add_argument("--no-traces", action="store_true", help="the sweeps only")
    args = ap.parse_args()
    problems = sweep_problems() + ([] if args.no_traces else trace_problems())
    rows = []
    for name, p in problems:
        q = copy.deepcopy(p)
        (_, lp_cpu) = _cpu(lambda q=q: lower_bound_info(q))
        before, plan_cpu = _cpu(lambda q=q: plan_pool(q, "auto"))
        after, after_cpu = _cpu(lambda p=p: plan_pool(p, "auto"))
        same = (before.weighted_jct_s == after.weighted_jct_s
                and before.lower_bound_s == after.lower_bound_s
                and before.to_dict().get("tasks") == after.to_dict().get("tasks"))
        row = {"instance": name, "jobs": len(p.jobs),
               "with_lp_cpu_s": round(lp_cpu + plan_cpu, 2), "of_which_lp_s": round(lp_cpu, 2),
               "without_cpu_s": round(after_cpu, 2),
               "ratio": round((lp_cpu + plan_cpu) / max(after_cpu, 1e-9), 2),
               "weighted_jct_s": after.weighted_jct_s, "same_plan": same}
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(),
                                          "command": " ".join(["python", *sys.argv]),
                                          "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
