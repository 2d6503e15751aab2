"""Issue 11.7: the model keeps measurements (gpus column, calibrated sync, piecewise step time)."""

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
