"""Statistical efficiency: the gradient noise scale estimate and the elastic job format."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hetsched.core.efficiency import (
    GNSTracker,
    ProgressModel,
    efficiency,
    features,
    gns_from_norms,
    sample_remaining,
)


def test_gns_within_20_percent_of_exact_on_linear_regression() -> None:
    """Least squares at a fixed point: per-sample gradients are known exactly.

    The exact noise scale tr(Sigma)/|G|^2 comes from all N per-sample
    gradients; the estimate sees only what a 3-rank job with uneven local
    batches (8, 24, 40) sees: each rank's mean gradient and the global one.
    """
    rng = np.random.default_rng(0)
    N, d = 100_000, 20
    X = rng.normal(size=(N, d))
    w_true = rng.normal(size=d)
    y = X @ w_true + 2.0 * rng.normal(size=N)
    w = w_true + 0.3 * rng.normal(size=d)
    g = X * (X @ w - y)[:, None]
    G = g.mean(axis=0)
    exact = float(((g - G) ** 2).sum(axis=1).mean() / (G @ G))
    tr = GNSTracker(decay=0.98)
    bs = [8, 24, 40]
    for _ in range(400):
        idx = rng.choice(N, sum(bs), replace=False)
        parts = np.split(idx, np.cumsum(bs)[:-1])
        local = [float((g[p].mean(axis=0) ** 2).sum()) for p in parts]
        tr.update(gns_from_norms(local, bs, float((g[idx].mean(axis=0) ** 2).sum()), sum(bs)))
    est = tr.noise_scale
    assert est is not None
    assert abs(est - exact) / exact < 0.2, (est, exact)
    # equal shares still give two batch sizes (local and global)
    e = gns_from_norms([4.0, 4.0], [8, 8], 2.0, 16)
    assert e.g2 == pytest.approx(0.0, abs=1e-9) and e.trace == pytest.approx(32.0)
    with pytest.raises(ValueError):
        gns_from_norms([1.0], [8], 1.0, 8)


def test_efficiency_is_pollux_and_one_at_the_users_batch() -> None:
    assert efficiency(256, 256, 1000.0) == 1.0
    assert efficiency(1024, 256, 1000.0) == pytest.approx(1256 / 2024)
    assert efficiency(64, 256, 1000.0) > 1.0
    assert efficiency(4096, 256, None) == 1.0  # unknown noise: ONES's linear-scaling assumption


def test_progress_model_learns_from_history() -> None:
    """Jobs of 10 epochs: after k epochs progress is k/10; the fitted Beta predicts it."""
    X, y = [], []
    for job in range(12):
        loss0 = 2.0 + 0.1 * job
        for k in range(1, 10):
            X.append(features(5000, k, loss0, loss0 * (1 - 0.08 * k)))
            y.append(k / 10)
    m = ProgressModel().fit(np.array(X), np.array(y))
    assert m.n_train == len(y)
    rem = m.mean_remaining(features(5000, 5, 2.05, 2.05 * 0.6), done=5.0)
    assert 3.5 < m.mean_remaining(features(5000, 5), done=5.0) < 6.5  # losses unknown
    assert 3.5 < rem < 6.5, rem  # truth: 5 epochs left
    draws = sample_remaining(np.random.default_rng(1), *m.beta(features(5000, 5, 2.05, 1.23)),
                             done=5.0, total_hint=99.0, n=500)
    assert (draws > 0).all() and 3.0 < float(np.median(draws)) < 7.0
    assert sample_remaining(np.random.default_rng(1), 2, 2, 0.0, 7.0)[0] == 7.0


def _plan_cli(tmp: Path, job_yaml: str) -> subprocess.CompletedProcess[str]:
    (tmp / "jobs.yaml").write_text(job_yaml)
    root = Path(__file__).resolve().parents[1]
    exe = shutil.which("hetsched") or sys.exit("the hetsched console script is not installed")
    return subprocess.run([exe, "plan", str(tmp / "jobs.yaml"),
                           "--cluster", str(root / "examples" / "cluster.yaml"),
                           "--throughputs", str(root / "examples" / "gavel_throughputs.csv"),
                           "--policy", "fifo", "--format", "json"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("elastic,msg", [
    ("{min_batch: 64, max_batch: 128, lr_scaling: cubic}",
     "elastic: lr_scaling: 'cubic' is not valid; expected linear, sqrt, none"),
    ("{min_batch: 512, max_batch: 2048}",
     "min_batch 512 <= global_batch 256 <= max_batch 2048 does not hold"),
    ("{min_batch: 64, max_bach: 2048}", "unknown field 'max_bach'"),
    ("{min_batch: 0}", "min_batch: must be >= 1"),
])
def test_bad_elastic_field_is_one_line(tmp_path: Path, elastic: str, msg: str) -> None:
    r = _plan_cli(tmp_path, "jobs:\n  - {name: a, workload: resnet-18, dataset_size: 5000, "
                  f"epochs: 1, global_batch: 256, elastic: {elastic}}}\n")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0] and "job 'a'" in lines[0], lines
