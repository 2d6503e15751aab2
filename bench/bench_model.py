"""Model error on Gavel's measured throughput table, before and after piecewise, calibrated step-time curves.

Run: python bench/bench_model.py [--out docs/bench_model.json]

Every isolated measurement of Gavel's ``simulation_throughputs.json`` with a
batch size (5 models x 3 GPU types x 4-5 batches x scale 1/2/4/8) is predicted
as one synchronous iteration time and compared with the measurement
(``scale / throughput``):

* before: one affine step-time line per (model, GPU type) fitted on the
  one-GPU points, plus the ring all-reduce of the model's gradient
  (``hetsched.io.traces.MODEL_SIZE_MB``) at 300 Gbit/s inside a server (the
  old converter dropped the 2/4/8-GPU measurements, so this is what the
  planner predicted);
* after: the affine line, or the monotone piecewise curve where the line
  misses a point by more than 20%, plus the synchronisation time calibrated
  from the 2/4/8-GPU measurements;
* after, leave-one-batch-out: the same, but each multi-GPU point predicted
  with the calibration from the *other* batch sizes only (an honest
  out-of-sample figure for the calibration).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
from gavel_data import GAVEL as GAVEL_DIR  # noqa: E402

sys.path.insert(0, str(ROOT))

from hetsched.core.model import allreduce_time  # noqa: E402
from hetsched.core.throughput import ProfileRow, fit_rows  # noqa: E402
from hetsched.io.profiles import load_gavel  # noqa: E402
from hetsched.io.traces import MODEL_SIZE_MB  # noqa: E402

GAVEL = GAVEL_DIR / "simulation_throughputs.json"
BW_GBPS = 300.0


def predictions(rows: list[ProfileRow]) -> list[dict[str, object]]:
    groups: dict[tuple[str, str], list[ProfileRow]] = {}
    for r in rows:
        groups.setdefault((r.workload, r.gpu_type), []).append(r)
    out = []
    for (w, g), rs in sorted(groups.items()):
        one = [r for r in rs if r.gpus == 1]
        multi = [r for r in rs if r.gpus > 1]
        before = fit_rows(one, None, piecewise=False)
        after = fit_rows(one, multi)
        for r in rs:
            K = r.gpus
            ring = allreduce_time(K, MODEL_SIZE_MB.get(w, 0.0), BW_GBPS)
            pb = before.step_time(r.local_batch) + ring
            sync = after.sync_at(K) if K > 1 else 0.0
            pa = after.step_time(r.local_batch) + (sync or 0.0)
            if K > 1:
                loo = fit_rows(one, [m for m in multi if m.local_batch != r.local_batch])
                pl = loo.step_time(r.local_batch) + (loo.sync_at(K) or 0.0)
            else:
                pl = pa
            out.append({"workload": w, "gpu_type": g, "local_batch": r.local_batch, "gpus": K,
                        "measured_s": r.step_time_s, "before_s": pb, "after_s": pa,
                        "after_loo_s": pl, "piecewise": bool(after.knots)})
    return out


def summary(pts: list[dict[str, object]], key: str) -> dict[str, float]:
    err = np.array([abs(float(p[key]) / float(p["measured_s"]) - 1.0) for p in pts])  # type: ignore[arg-type]
    return {"points": len(err), "median_abs_rel_err": float(np.median(err)),
            "mean_abs_rel_err": float(err.mean()), "over_20pct": int((err > 0.2).sum()),
            "max_abs_rel_err": float(err.max())}


def efficiency(pts: list[dict[str, object]], key: str) -> dict[int, float]:
    """Median per-GPU efficiency at each scale: t(1 GPU, b) / t(K GPUs, b)."""
    one = {(p["workload"], p["gpu_type"], p["local_batch"]): float(p[key])  # type: ignore[arg-type]
           for p in pts if p["gpus"] == 1}
    out: dict[int, list[float]] = {}
    for p in pts:
        k = int(p["gpus"])  # type: ignore[call-overload]
        base = one.get((p["workload"], p["gpu_type"], p["local_batch"]))
        if k > 1 and base:
            out.setdefault(k, []).append(base / float(p[key]))  # type: ignore[arg-type]
    return {k: statistics.median(v) for k, v in sorted(out.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench_model.json"))
    args = ap.parse_args()
    # isolated measurements only: the converter also keeps Gavel's co-located pairs
    pts = predictions([r for r in load_gavel(GAVEL) if r.colocated_with is None])
    res: dict[str, object] = {}
    for scope, sel in (("1 GPU", lambda p: p["gpus"] == 1), ("2-8 GPUs", lambda p: p["gpus"] > 1),
                       ("all", lambda p: True)):
        sub = [p for p in pts if sel(p)]
        res[scope] = {k: summary(sub, k) for k in ("before_s", "after_s", "after_loo_s")}
    res["efficiency"] = {k: efficiency(pts, k) for k in ("measured_s", "before_s", "after_s")}
    res["piecewise_pairs"] = sorted({f"{p['workload']}/{p['gpu_type']}" for p in pts
                                     if p["piecewise"]})
    Path(args.out).write_text(json.dumps({"summary": res, "points": pts}, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
