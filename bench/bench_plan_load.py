"""What reading a plan costs: ``plan_from_dict`` (validate, type) and ``Plan.to_dict``.

Times a plan file already parsed as JSON (CPU seconds, the least of
``--repeats``), so the figure is hetsched's own work, not the JSON parser's.
Run it once per checkout with that checkout first on ``PYTHONPATH`` to
compare two versions on one plan, side by side::

    hetsched plan examples/jobs.yaml --cluster examples/cluster.yaml \\
        --throughputs examples/gavel_throughputs.csv --mode pool --policy hare \\
        --task-iterations 1 --out /tmp/pool.json
    PYTHONPATH=. python bench/bench_plan_load.py /tmp/pool.json
"""

from __future__ import annotations

import argparse
import json
import time

from hetsched.io.plan_json import plan_from_dict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with open(args.plan) as f:
        body = json.load(f)
    load, dump = [], []
    for _ in range(args.repeats):
        t = time.process_time()
        plan = plan_from_dict(body, args.plan)
        load.append(time.process_time() - t)
        t = time.process_time()
        same = plan.to_dict() == body
        dump.append(time.process_time() - t)
    tasks = body.get("tasks") or {}
    print(json.dumps({"jobs": len(body["jobs"]), "tasks": tasks.get("total_tasks"),
                      "stored_rows": tasks.get("stored_rows"),
                      "load_cpu_s": round(min(load), 3), "to_dict_cpu_s": round(min(dump), 3),
                      "round_trip_exact": same}))


if __name__ == "__main__":
    main()
