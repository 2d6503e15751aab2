"""The performance model: water-filling time, all-reduce, affine fit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsched.core.model import allreduce_time, comm_time, continuous_time_counts
from hetsched.core.throughput import ProfileRow, ThroughputTable, fit_affine


def bisect_time(a, c, cap, n, B) -> float:
    """Reference: smallest T with sum_t n_t * clip((T - a_t)/c_t, 1, cap_t) >= B, by bisection."""
    used = n > 0
    if not used.any() or (n * cap).sum() < B:
        return np.inf
    lo = float((a + c)[used].max())  # every used worker has >= 1 sample
    hi = float((a + c * cap)[used].max())

    def samples(T: float) -> float:
        return float((n * np.clip((T - a) / c, 1.0, cap))[used].sum())

    if samples(lo) >= B:
        return lo
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if samples(mid) >= B:
            hi = mid
        else:
            lo = mid
    return hi


@st.composite
def allocations(draw: st.DrawFn):
    T = draw(st.integers(1, 4))
    a = np.array([draw(st.sampled_from([0.0, 0.003, 0.05, 0.3])) for _ in range(T)])
    c = np.array([draw(st.floats(1e-4, 0.05)) for _ in range(T)])
    cap = np.array([draw(st.integers(1, 64)) for _ in range(T)], dtype=float)
    N = np.array([[draw(st.integers(0, 5)) for _ in range(T)]
                  for _ in range(draw(st.integers(1, 6)))])
    B = draw(st.integers(1, 300))
    return a, c, cap, N, B


@settings(max_examples=150, deadline=None)
@given(allocations())
def test_continuous_time_counts_matches_bisection(x) -> None:
    a, c, cap, N, B = x
    got = continuous_time_counts(a, c, cap, N, float(B))
    assert got.shape == (len(N),)
    for m, n in enumerate(N):
        ref = bisect_time(a, c, cap, n, B)
        if np.isinf(ref):
            assert np.isinf(got[m]), (n, got[m])
        else:
            assert got[m] == pytest.approx(ref, rel=1e-9, abs=1e-12), n


def test_continuous_time_counts_known_values() -> None:
    a = np.array([0.0, 0.1])
    c = np.array([0.01, 0.01])
    cap = np.array([100.0, 100.0])
    N = np.array([[1, 0], [2, 0], [1, 1], [0, 0], [1, 0]])
    B = np.array([50.0, 50.0, 50.0, 50.0, 101.0])
    got = continuous_time_counts(a, c, cap, N, B)
    # 1 GPU: 0.5 s; 2 GPUs: 25 each, 0.25 s; mixed: (T/0.01) + (T-0.1)/0.01 = 50 -> T = 0.3
    assert got[:3] == pytest.approx([0.5, 0.25, 0.3])
    assert np.isinf(got[3])  # no GPU
    assert np.isinf(got[4])  # 101 samples do not fit a cap of 100


def test_allreduce_formula() -> None:
    # 2(K-1)/K * size / bandwidth: 4 workers, 100 MB = 8e8 bits, 10 Gbit/s: 1.5 * 0.08 s = 0.12 s
    assert allreduce_time(4, 100.0, 10.0) == pytest.approx(2 * 3 / 4 * 100 * 8e6 / 10e9)
    assert allreduce_time(4, 100.0, 10.0) == pytest.approx(0.12)
    assert allreduce_time(2, 250.0, 300.0) == pytest.approx(2 * 1 / 2 * 250 * 8e6 / 300e9)
    assert allreduce_time(1, 100.0, 10.0) == 0.0
    assert allreduce_time(8, 0.0, 10.0) == 0.0
    # the ring's per-worker volume approaches 2x the model as K grows
    assert allreduce_time(1000, 100.0, 10.0) == pytest.approx(0.16 * 999 / 1000)


def test_comm_time_uses_model_size_else_measured_sync() -> None:
    assert comm_time(4, 100.0, 10.0, measured_sync_s=5.0) == pytest.approx(0.12)
    assert comm_time(4, 0.0, 10.0, measured_sync_s=0.02) == 0.02
    assert comm_time(1, 100.0, 10.0, measured_sync_s=0.02) == 0.0


def test_fit_affine_recovers_exact_line() -> None:
    b = np.array([16, 32, 64, 128], dtype=float)
    a, c, rel = fit_affine(b, 0.012 + 0.0034 * b)
    assert a == pytest.approx(0.012, rel=1e-9)
    assert c == pytest.approx(0.0034, rel=1e-9)
    assert rel == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(1e-5, 0.1),
       st.lists(st.integers(1, 512), min_size=2, max_size=6, unique=True))
def test_fit_affine_recovers_any_nonnegative_line(a0, c0, batches) -> None:
    b = np.array(batches, dtype=float)
    a, c, _ = fit_affine(b, a0 + c0 * b)
    assert a == pytest.approx(a0, rel=1e-6, abs=1e-9)
    assert c == pytest.approx(c0, rel=1e-6)


def test_fit_affine_never_returns_a_negative_intercept() -> None:
    # exact points of t = -0.05 + 0.01 b: ordinary least squares would give a = -0.05;
    # non-negative least squares clamps a to 0 and refits the slope
    b = np.array([10, 20, 40], dtype=float)
    t = -0.05 + 0.01 * b
    a, c, rel = fit_affine(b, t)
    assert a == 0.0
    ols_c = float(np.sum(b * t) / np.sum(b * b))  # least squares through the origin
    assert c == pytest.approx(ols_c)
    assert rel > 0


def test_fit_affine_single_batch_is_proportional() -> None:
    a, c, rel = fit_affine(np.array([32.0, 32.0]), np.array([0.30, 0.34]))
    assert a == 0.0
    assert c == pytest.approx(0.32 / 32)


def test_throughput_table_fits_per_pair_and_caps_at_largest_batch() -> None:
    rows = [ProfileRow("w", "v100", b, 0.01 + 0.002 * b) for b in (8, 16, 32)]
    rows += [ProfileRow("w", "k80", b, 0.03 + 0.008 * b, sync_time_s=s)
             for b, s in ((8, 0.1), (16, 0.3))]
    rows += [ProfileRow("w", "p100", 8, 0.05, max_local_batch=12),
             ProfileRow("w", "p100", 16, 0.09, max_local_batch=10)]
    tab = ThroughputTable(rows)
    v = tab.get("w", "v100")
    assert (v.a, v.c, v.max_batch, v.sync_s) == (pytest.approx(0.01), pytest.approx(0.002), 32, 0.0)
    k = tab.get("w", "k80")
    assert k.max_batch == 16 and k.sync_s == pytest.approx(0.2)
    assert tab.get("w", "p100").max_batch == 10  # the smallest explicit cap wins
    assert v.peak_throughput == pytest.approx(32 / (0.01 + 0.002 * 32))
    assert tab.get("w", "a100") is None
    assert tab.types_for("w") == ["k80", "p100", "v100"]
