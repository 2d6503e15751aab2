"""Benchmark a co-location group against running its jobs one after the other (CPU).

Method: two jobs on the same two ranks (local processes, gloo over loopback),
with emulated GPU speeds (``HETSCHED_EMULATE_SPEED``/``COST``) and an
emulated slow link (``HETSCHED_EMULATE_LINK``), as the testbed test has them:

* ``comp``: the built-in CNN (10 k parameters), ``--comp-batch`` samples per rank;
* ``comm``: the built-in MLP (85 k parameters), ``--comm-batch`` samples per rank.

Serial: each job alone (``trainer.py``, the isolated runtime), one after the
other; its per-step COMP and COMM are read from its reports (medians; COMP of
the slowest rank, COMM of the least waiting one). Group: both as one group
(``runtime/group.py``), without and with a memory budget of 0 (every switch
spills the idle job's state and reloads it). Reported: each run's training
wall time (the ``done`` records), the ratio group / serial, the group's median
round against Harmony's eq. (1) from the alone COMP and COMM, and the spill
variant's cost.

Usage::

    python bench/bench_group_run.py [--steps 25] [--cost 0.1,0.015] [--link 0.02,0.9]
                                    [--comp-batch 20] [--comm-batch 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from group_helpers import group_job, group_plan, write_plan  # noqa: E402

from hetsched.core.colocation import group_iteration_s  # noqa: E402
from hetsched.core.spec import Job  # noqa: E402
from hetsched.io.reports import iter_records  # noqa: E402
from hetsched.runtime.job import (  # noqa: E402
    _local_group_main,
    _local_rank_main,
    build_config,
    build_group_config,
)
from hetsched.runtime.launcher import spawn_local  # noqa: E402


def _alone(tmp: Path, name: str, workload: str, batch: int, steps: int) -> dict[str, float]:
    d = tmp / f"alone-{name}"
    d.mkdir()
    workers = [{"gpu_type": "v100", "node": n, "local_batch": batch} for n in ("n1", "n2")]
    spec = Job(name=name, workload=workload, dataset_size=steps * 2 * batch, epochs=1,
               global_batch=2 * batch)
    cfg = build_config(spec, workers, 2, name, {}, {
        "device": "cpu", "checkpoint": str(d / "ck.pt"), "report": str(d / "r.jsonl"),
        "report_every": 1, "checkpoint_every": 10_000})
    assert spawn_local(2, _local_rank_main, (cfg,), timeout_s=600) == [0, 0]
    recs = list(iter_records(d / "r.jsonl", "steps"))
    return {"comp_s": max(median(r["compute_s"] for r in recs if r["rank"] == k)
                          for k in (0, 1)),
            "comm_s": min(median(r["sync_s"] for r in recs if r["rank"] == k) for k in (0, 1)),
            "wall_s": float(next(iter_records(d / "r.jsonl", "done"))["time_s"])}


def _group(tmp: Path, tag: str, plan: Path, budget: float | None) -> dict[str, Any]:
    d = tmp / tag
    os.environ["HETSCHED_CHECKPOINT_DIR"] = str(d / "ck")
    os.environ["HETSCHED_REPORT_DIR"] = str(d / "rep")
    cfg = build_group_config(str(plan), "g1", None, dict(os.environ),
                             {"device": "cpu", "checkpoint_every": 10_000,
                              "memory_budget_mb": budget})
    assert spawn_local(2, _local_group_main, (cfg,), timeout_s=600) == [0, 0]
    recs = list(iter_records(next((d / "rep").rglob("comp.jsonl"))))
    g = [r for r in recs if r["kind"] == "group"][0]
    done = [r for r in recs if r["kind"] == "done"][0]
    return {"wall_s": float(done["time_s"]), "round_median_s": g["iteration_median_s"],
            "round_mean_s": g["iteration_s"], "rounds": g["rounds"], "spills": g["spills"],
            "reloads": g["reloads"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--cost", default="0.1,0.015")
    ap.add_argument("--link", default="0.02,0.9")
    ap.add_argument("--comp-batch", type=int, default=20)
    ap.add_argument("--comm-batch", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ.update({"HETSCHED_EMULATE_SPEED": "v100=1", "HETSCHED_EMULATE_COST": a.cost,
                       "HETSCHED_EMULATE_LINK": a.link, "HETSCHED_REPORT_EVERY": "1"})
    jobs = (("comp", "cnn", a.comp_batch), ("comm", "mlp", a.comm_batch))
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        alone = {n: _alone(tmp, n, w, b, a.steps) for n, w, b in jobs}
        plan = write_plan(group_plan([group_job(n, w, (b, b), dataset_size=a.steps * 2 * b,
                                                slots=(("n1", "v100", 0), ("n2", "v100", 0)))
                                      for n, w, b in jobs]), tmp / "plan.json")
        group = _group(tmp, "group", plan, None)
        spill = _group(tmp, "spill", plan, 0.0)
    eq1 = group_iteration_s([alone[n]["comp_s"] for n, _, _ in jobs],
                            [alone[n]["comm_s"] for n, _, _ in jobs])
    serial = sum(v["wall_s"] for v in alone.values())
    out = {"steps": a.steps, "cost": a.cost, "link": a.link, "alone": alone,
           "serial_wall_s": serial, "group": group, "group_spill": spill,
           "eq1_round_s": eq1, "group_over_serial": group["wall_s"] / serial,
           "round_error": (group["round_median_s"] - eq1) / eq1,
           "spill_over_group": spill["wall_s"] / group["wall_s"]}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for n, v in alone.items():
        print(f"alone {n}: COMP {v['comp_s']:.4f} s, COMM {v['comm_s']:.4f} s, "
              f"wall {v['wall_s']:.2f} s")
    print(f"serial (one after the other): {serial:.2f} s")
    print(f"group: {group['wall_s']:.2f} s ({out['group_over_serial']:.2f}x serial); round "
          f"median {group['round_median_s']:.4f} s vs eq. (1) {eq1:.4f} s "
          f"({100 * out['round_error']:+.1f}%)")
    print(f"group, memory budget 0 (spill+reload every switch): {spill['wall_s']:.2f} s "
          f"({out['spill_over_group']:.2f}x the group; {spill['spills']} spills of comp)")


if __name__ == "__main__":
    main()
