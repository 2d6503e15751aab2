"""The model keeps measurements (gpus column, calibrated sync, piecewise step time)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from hetsched.cli.main import main
from hetsched.core.throughput import POOR_FIT, ProfileRow, ThroughputTable, fit_rows
from hetsched.errors import InputError
from hetsched.io.profiles import parse_csv, write_csv

# one GPU type, compute t(b) = 0.01 + 0.001 b; whole iterations measured at 2 and 4 GPUs
CSV = """workload,gpu_type,local_batch,step_time_s,gpus
w,v100,16,0.026,1
w,v100,32,0.042,1
w,v100,16,0.036,2
w,v100,32,0.052,2
w,v100,16,0.056,4
w,v100,32,0.072,4
"""
CLUSTER = """name: c
nodes:
  - names: n1
    gpu_type: v100
    gpus: 4
network: {intra_node_gbps: 300, inter_node_gbps: 10}
"""


def test_gpus_column_round_trips_and_is_checked() -> None:
    rows = parse_csv(CSV, "p.csv")
    assert [r.gpus for r in rows] == [1, 1, 2, 2, 4, 4]
    buf = io.StringIO()
    write_csv(rows, buf)
    assert parse_csv(buf.getvalue(), "again.csv") == rows
    with pytest.raises(InputError, match="column 'gpus'"):
        parse_csv(CSV.replace("16,0.036,2", "16,0.036,2.5"), "bad.csv")


def test_sync_is_calibrated_from_multi_gpu_measurements() -> None:
    fit = ThroughputTable(parse_csv(CSV, "p.csv")).get("w", "v100")
    assert fit is not None
    assert fit.a == pytest.approx(0.01) and fit.c == pytest.approx(0.001)
    assert fit.sync_curve == ((2, pytest.approx(0.010)), (4, pytest.approx(0.030)))
    assert fit.sync_at(3) == pytest.approx(0.020)  # linear between measured scales
    assert fit.sync_at(1) == 0.0


def test_plan_uses_the_calibrated_sync_not_the_ring_estimate(runner, tmp_path) -> None:
    (tmp_path / "p.csv").write_text(CSV)
    (tmp_path / "c.yaml").write_text(CLUSTER)
    # a big model: the ring estimate at 300 Gbit/s would be 2*(K-1)/K * 8 Gbit / 300 Gbit/s
    (tmp_path / "j.yaml").write_text(
        "jobs:\n  - {name: a, workload: w, dataset_size: 64000, epochs: 1, global_batch: 64,"
        " model_size_mb: 1000, min_gpus: 2, max_gpus: 2}\n")
    res = runner.invoke(main, ["plan", str(tmp_path / "j.yaml"), "--cluster",
                               str(tmp_path / "c.yaml"), "--throughputs",
                               str(tmp_path / "p.csv"), "--policy", "fifo", "--format", "json"])
    assert res.exit_code == 0, res.output
    seg = json.loads(res.stdout)["jobs"][0]["segments"][0]
    assert len(seg["workers"]) == 2
    assert seg["comm_s"] == pytest.approx(0.010)  # measured at 2 GPUs, not ~0.027 s (ring)


def test_piecewise_model_where_the_line_is_poor() -> None:
    # Gavel's ResNet-18 on K80: the 16-sample step is slower than the 32-sample one
    pts = [(16, 0.2085), (32, 0.1394), (64, 0.1418), (128, 0.5535), (256, 1.1292)]
    rows = [ProfileRow("r", "k80", b, t) for b, t in pts]
    line = fit_rows(rows, piecewise=False)
    pw = fit_rows(rows)
    assert line.max_rel_err > POOR_FIT and pw.knots
    ts = [t for _, t in pw.knots]
    assert all(x <= y for x, y in zip(ts, ts[1:], strict=False))  # monotone
    err_line = max(abs(line.step_time(b) / t - 1) for b, t in pts)
    err_pw = max(abs(pw.step_time(b) / t - 1) for b, t in pts)
    assert err_pw < err_line / 2
    assert pw.step_time(128) == pytest.approx(0.5535) and pw.step_time(256) == pytest.approx(1.1292)
    # a good line stays a line
    good = fit_rows([ProfileRow("g", "v100", b, 0.01 + 0.001 * b) for b in (8, 16, 32)])
    assert not good.knots
    assert np.isclose(good.step_time(20), 0.03)


def _k80_resnet18_rows() -> list[ProfileRow]:
    # Gavel's ResNet-18 on K80 (piecewise) next to a well-fitted V100 line
    pts = [(16, 0.2085), (32, 0.1394), (64, 0.1418), (128, 0.5535), (256, 1.1292)]
    return ([ProfileRow("r", "k80", b, t) for b, t in pts]
            + [ProfileRow("r", "v100", b, 0.01 + 0.0012 * b) for b in (16, 32, 64, 128, 256)])


def test_balanced_shares_on_piecewise_curves_are_the_integer_optimum() -> None:
    """Batch splitting uses the piecewise model; brute force agrees."""
    import itertools

    from hetsched.core.model import balanced_shares, step_time

    table = ThroughputTable(_k80_resnet18_rows())
    k80, v100 = table.get("r", "k80"), table.get("r", "v100")
    assert k80 is not None and v100 is not None and k80.knots and not v100.knots
    fits = [k80, k80, v100]
    a = [f.a for f in fits]
    c = [f.c for f in fits]
    caps = [f.max_batch for f in fits]
    cvs = [f.curve() for f in fits]
    for B in (3, 40, 97, 300, 512, 700):
        b = balanced_shares(a, c, caps, B, cvs)
        assert sum(b) == B and all(1 <= x <= cap for x, cap in zip(b, caps, strict=True))
        best = min(max(f.step_time(x) for f, x in zip(fits, split, strict=True))
                   for split in ((x, y, B - x - y) for x, y in itertools.product(
                       range(1, caps[0] + 1), range(1, caps[1] + 1)) if 1 <= B - x - y <= caps[2]))
        assert step_time(a, c, b, cvs) == pytest.approx(best, rel=1e-6)
        # the same model as StepFit reports (the curve differs only by the 1e-9 tie-breaking)
        assert step_time(a, c, b, cvs) == pytest.approx(
            max(f.step_time(x) for f, x in zip(fits, b, strict=True)), rel=1e-6)


def test_planner_predicts_and_splits_with_the_same_piecewise_model() -> None:
    """The policies' estimate (continuous water-filling), the evaluator's integer shares
    and StepFit.step_time all follow the piecewise curve on a poorly-fitted type."""
    from hetsched.core.problem import PlanningProblem
    from hetsched.core.spec import Cluster, Node
    from hetsched.io.specs import parse_jobs
    from hetsched.planning.space.evaluator import simulate
    from hetsched.planning.space.policies.base import REGISTRY

    table = ThroughputTable(_k80_resnet18_rows())
    cl = Cluster(nodes=(Node("k", "k80", 2), Node("v", "v100", 1)), intra_node_gbps=300.0,
                 inter_node_gbps=10.0)
    jobs = parse_jobs([dict(name="j", workload="r", global_batch=96, epochs=1,
                            dataset_size=96 * 50, min_gpus=3)], "t")
    p = PlanningProblem(jobs, cl, table)
    t_k80 = p.types.index("k80")
    assert p.curves[0] is not None and p.curves[0][t_k80] is not None
    plan = simulate(p, REGISTRY["optimus-lb"](), restart_cost_s=0.0)
    seg = plan.jobs[0].segments[0]
    fits = {g: table.get("r", g) for g in ("k80", "v100")}
    want = max(fits[w.gpu_type].step_time(w.local_batch) for w in seg.workers)  # type: ignore
    assert seg.compute_s == pytest.approx(want, rel=1e-6)
    # shares split on the affine line alone would be slower on the measured curve
    from hetsched.core.model import balanced_shares

    ws = [fits[w.gpu_type] for w in seg.workers]
    affine = balanced_shares([f.a for f in ws], [f.c for f in ws],  # type: ignore[union-attr]
                             [f.max_batch for f in ws], 96)  # type: ignore[union-attr]
    slower = max(f.step_time(b) for f, b in zip(ws, affine, strict=True))  # type: ignore
    assert sorted(w.local_batch for w in seg.workers) != sorted(affine)
    assert slower > 1.2 * seg.compute_s
    # the policies' continuous estimate is the relaxation of the same model: never above
    # the integer split, and close to it
    n = np.zeros((1, p.T), dtype=int)
    for w in seg.workers:
        n[0, p.types.index(w.gpu_type)] += 1
    est = float(p.compute_time(0, n)[0])
    assert est <= seg.compute_s * (1 + 1e-9) and est >= 0.9 * seg.compute_s
    # the scalar estimate the greedy policies use agrees with the vectorised one
    for counts in ((1, 1), (2, 0), (0, 1), (2, 1), (1, 0)):
        vec = np.array([counts])
        assert p.iter_time1(0, counts) == pytest.approx(float(p.iter_time(0, vec)[0]), rel=1e-9)
