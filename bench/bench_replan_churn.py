"""Cancellations per replan on a 60-job converted Gavel trace.

Submits the trace's first 60 jobs (placeable ones; a converted trace has jobs
no GPU set of this cluster holds) to the in-memory Slurm (hetsched/slurm/memory.py:
the same submit/replan code as on a real cluster, without its timing), lets
them start, then applies reset events one at a time, each followed by
``hetsched replan``:

1. the first running job completes;
2. a running job fails;
3. a node goes down (its jobs are requeued);
4. the node comes back.

Per replan it counts Slurm jobs cancelled, pending jobs changed in place
(``scontrol update``), hetjobs submitted, dependencies rewritten in place, running
jobs moved (by the evaluator's keep-or-move decision), and
the jobs whose allocation changed (the target: cancellations <= those),
beside what cancel-and-resubmit-everything costs (every queued job).

Three variants run side by side on the same trace and events:

* ``resubmit``: the earlier replan (no placement hint,
  every pending job whose GPUs change is cancelled and resubmitted);
* ``sticky``: the planner keeps a job's Slurm GPUs when its per-type counts
  stay (``prefer_gpus``), pending jobs still resubmitted;
* ``in-place`` (what replan does): sticky, and pending jobs changed in place
  where Slurm allows it.

Usage::

    python bench/bench_replan_churn.py [--jobs 60] [--policy fifo] [--json] [--variant V]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

from hetsched.app.monitor import Monitor
from hetsched.app.replan import replan
from hetsched.app.runnable import split_placeable
from hetsched.app.submit import submit
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import parse_jobs
from hetsched.io.traces import parse_trace
from hetsched.planning.planner import make_plan
from hetsched.slurm.inventory import load_cluster_from_slurm
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

ROOT = Path(__file__).resolve().parents[1]
from gavel_data import TRACES  # noqa: E402

TRACE = TRACES / "msr-seed0-0e4a51.trace"
NODES = tuple([(f"v100-{i}", "v100", 4) for i in (1, 2)]
              + [(f"p100-{i}", "p100", 4) for i in (1, 2)]
              + [(f"k80-{i}", "k80", 4) for i in (1, 2, 3, 4)])


def _jobs(trace: Path, n: int) -> list:
    raw, _ = parse_trace(trace, n)
    for j in raw:
        j["arrival_s"] = 0.0  # the batch is there at once
        j["command"] = ["true"]  # runnable (the in-memory Slurm runs nothing)
    return parse_jobs({"jobs": raw}, str(trace))


VARIANTS = ("resubmit", "sticky", "in-place")


def _variant(stack: ExitStack, variant: str) -> None:
    """Switch off what a variant lacks (module doc)."""
    if variant == "resubmit":
        stack.enter_context(mock.patch("hetsched.app.space_replan.held_gpus", lambda *_a: {}))
    if variant in ("resubmit", "sticky"):
        stack.enter_context(mock.patch("hetsched.app.replan_changes.component_order",
                                       lambda *_a: (None, "")))


def run(n_jobs: int, policy: str, trace: Path, variant: str = "in-place") -> dict:
    with ExitStack() as stack:
        _variant(stack, variant)
        return _run(n_jobs, policy, trace)


def _run(n_jobs: int, policy: str, trace: Path) -> dict:
    slurm = MemorySlurm(nodes_spec=NODES)
    table = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
    cluster = load_cluster_from_slurm(slurm, "gpu")
    jobs, skipped = split_placeable(_jobs(trace, n_jobs), cluster, table)
    plan = make_plan(jobs, cluster, table, policy=policy)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()

        def running() -> list[str]:
            return [i for i in slurm.active() if slurm.jobs_by_id[i].state == "RUNNING"]

        def node_of(jid: str) -> str:
            return slurm.jobs_by_id[jid].comps[0].running_on

        events = [
            ("one job completed", lambda: slurm.finish(running()[0])),
            ("one job failed", lambda: slurm.finish(running()[0], "FAILED", "NonZeroExitCode")),
            ("node down", lambda: slurm.node_down(node_of(running()[0]))),
            ("node back", lambda: slurm.node_state.clear()),
        ]
        for what, act in events:
            act()
            queued = len(slurm.active())
            c0, s0 = (slurm.count(k) for k in ("scancel", "sbatch"))
            cancelled0 = sum(len(a) for c, a in slurm.calls if c == "scancel")
            t0 = time.perf_counter()
            r = replan(st, slurm, table)
            dt = time.perf_counter() - t0
            cancelled = sum(len(a) for c, a in slurm.calls if c == "scancel") - cancelled0
            moved = [c for c in r.changes if c.was not in ("-",) and "dependency" not in c.why
                     and "failed" not in c.why]
            rows.append({
                "event": what, "queued_before": queued, "cancelled": cancelled,
                "allocation_changed": len(moved), "updated_in_place": len(r.updated),
                "submitted": slurm.count("sbatch") - s0,
                "dependencies_updated": sum("dependency" in c.why for c in r.changes),
                "kept": len(r.kept), "replan_s": round(dt, 2),
                # running jobs the keep-or-move decision moved (planning/space/decide.py)
                "running_moved": sum(c.why.startswith("running;") for c in r.changes),
                "resubmit_all_would_cancel": queued,
                "scancel_calls": slurm.count("scancel") - c0,
            })
            slurm.schedule()
            Monitor(st, slurm).poll()
    return {"jobs": len(jobs), "skipped_unplaceable": len(skipped), "policy": policy,
            "trace": trace.name, "submitted_first": len(ids), "replans": rows,
            "target_met": all(r["cancelled"] <= r["allocation_changed"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--variant", choices=VARIANTS, action="append",
                    help="run only these variants (default: all three)")
    a = ap.parse_args()
    res = {v: run(a.jobs, a.policy, a.trace, v) for v in (a.variant or VARIANTS)}
    if a.json:
        print(json.dumps(res, indent=2))
        return
    first = next(iter(res.values()))
    print(f"{first['trace']}: {first['jobs']} jobs planned ({first['skipped_unplaceable']} "
          f"unplaceable skipped), policy {first['policy']}")
    cols = ("event", "queued_before", "allocation_changed", "cancelled", "updated_in_place",
            "submitted", "dependencies_updated", "kept", "running_moved",
            "resubmit_all_would_cancel", "replan_s")
    print("variant | " + " | ".join(cols))
    for v, out in res.items():
        for r in out["replans"]:
            print(v + " | " + " | ".join(str(r[c]) for c in cols))
        print(f"{v}: cancelled {sum(r['cancelled'] for r in out['replans'])} in "
              f"{len(out['replans'])} replans; target (cancelled <= allocation changed): "
              + ("met" if out["target_met"] else "NOT met"))
    sys.exit(0 if all(o["target_met"] for o in res.values()) else 1)


if __name__ == "__main__":
    main()
