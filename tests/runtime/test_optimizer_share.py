"""The planner plans what the executor costs: a pool task's iteration has no optimizer step.

The probe measures the optimizer step's share of its step apart (``optimizer_s``), a
profile row carries it through the CSV and the profile history, pool planning takes it
off the step (and puts the coordinator's once-per-round step on the round's sync path
until an overhead is measured), and a pool task record folds into the history with a
weight that grows with its iterations. Structure only: no timings are asserted (the
figures are bench/bench_exec_overhead.py's ``--predict``).
"""

from __future__ import annotations

import importlib.util
import io
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.io.profiles import load_throughputs, parse_csv, write_csv
from hetsched.io.specs import load_cluster, load_jobs
from hetsched.planning.pool.problem import MIN_ITERATION_SHARE, PoolProblem
from hetsched.state.history import (
    DEFAULT_ALPHA,
    export_csv,
    forget,
    history_rows,
    import_rows,
    ingest_reports,
    table_from_store,
)
from hetsched.state.shares import MAX_TASK_ALPHA, fold_weight
from hetsched.state.store import open_store

EX = Path(__file__).resolve().parents[2] / "examples"


# ---------------------------------------------------------------------------
# the profile row and its CSV


def test_csv_round_trips_optimizer_s_and_old_files_still_load() -> None:
    rows = [ProfileRow("mlp", "v100", 8, 0.004, optimizer_s=0.001),
            ProfileRow("mlp", "v100", 32, 0.010, optimizer_s=0.0),
            ProfileRow("mlp", "v100", 64, 0.020)]
    buf = io.StringIO()
    write_csv(rows, buf)
    assert buf.getvalue().splitlines()[0].endswith(",optimizer_s")
    back = parse_csv(buf.getvalue(), "p.csv")
    assert [r.optimizer_s for r in back] == [0.001, 0.0, None]
    # a file written before the column: the share is unknown, the fit subtracts nothing
    old = parse_csv("workload,gpu_type,local_batch,step_time_s\nmlp,v100,8,0.004\n"
                    "mlp,v100,32,0.010\n", "old.csv")
    assert all(r.optimizer_s is None for r in old)
    fit = ThroughputTable(old).get("mlp", "v100")
    assert fit is not None and fit.optimizer_s == 0.0 and fit.optimizer_rows == 0
    # without any share the writer leaves the column out (old readers read the file)
    buf = io.StringIO()
    write_csv(old, buf)
    assert "optimizer_s" not in buf.getvalue()


@pytest.mark.parametrize(("value", "words"), [
    ("-0.001", "non-negative"), ("abc", "is not a number"), ("0.5", "exceeds the step")])
def test_csv_refuses_a_bad_optimizer_share(value: str, words: str) -> None:
    with pytest.raises(InputError) as e:
        parse_csv(f"workload,gpu_type,local_batch,step_time_s,optimizer_s\n"
                  f"mlp,v100,8,0.004,{value}\n", "p.csv")
    msg = str(e.value)
    assert "p.csv" in msg and "line 2" in msg and "optimizer_s" in msg and words in msg


def test_fit_keeps_the_median_share_as_a_constant() -> None:
    rows = [ProfileRow("mlp", "v100", b, t, optimizer_s=o)
            for b, t, o in ((8, 0.004, 0.0010), (32, 0.010, 0.0014), (64, 0.020, 0.0011),
                            (128, 0.040, None))]
    fit = ThroughputTable(rows).get("mlp", "v100")
    assert fit is not None and fit.optimizer_rows == 3
    assert fit.optimizer_s == pytest.approx(0.0011)


# ---------------------------------------------------------------------------
# the probe


torch_needed = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                  reason="needs torch")


def _slow_optimizer(monkeypatch: pytest.MonkeyPatch, pause: float) -> None:
    """Every optimizer the probe builds sleeps ``pause`` seconds in its step."""
    from hetsched.runtime import probe as probe_mod

    real = probe_mod.load_workload

    def load(*a: Any, **k: Any) -> Any:
        wl = real(*a, **k)
        make = wl.optimizer

        def factory(params: Any) -> Any:
            opt = make(params)
            step = opt.step

            def slow(*sa: Any, **sk: Any) -> Any:
                time.sleep(pause)
                return step(*sa, **sk)

            opt.step = slow  # type: ignore[method-assign]
            return opt

        wl.optimizer = factory
        return wl

    monkeypatch.setattr(probe_mod, "load_workload", load)


@torch_needed
def test_probe_times_the_optimizer_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer step made 30 ms longer shows in the row's ``optimizer_s`` (at least
    the sleep: a lower bound, not a timing), and the share is part of the step."""
    from hetsched.runtime.probe import probe

    _slow_optimizer(monkeypatch, 0.03)
    rows = probe("mlp", "v100", [4, 8], warmup=1, steps=2, device="cpu", sync=False).rows
    assert [r.local_batch for r in rows] == [4, 8]
    for r in rows:
        assert r.optimizer_s is not None and 0.03 <= r.optimizer_s <= r.step_time_s
    # the probe's CSV carries it to the planner, whose pool iteration leaves it out
    buf = io.StringIO()
    write_csv(rows, buf)
    fit = ThroughputTable(parse_csv(buf.getvalue(), "probe.csv")).get("mlp", "v100")
    assert fit is not None and fit.optimizer_s >= 0.03 and fit.optimizer_rows == 2


@torch_needed
def test_under_an_emulated_floor_the_optimizer_adds_only_what_passes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The testbed's floor (0.3 s + 1 ms a sample here) covers the optimizer as it covers
    the executor's iteration: the share is what the step took beyond the same step
    without its optimizer, floored alike, so never more than the step's time past the
    floor, however long the optimizer itself took (30 ms more here)."""
    from hetsched.runtime.probe import probe

    _slow_optimizer(monkeypatch, 0.03)
    monkeypatch.setenv("HETSCHED_EMULATE_SPEED", "slow=1")
    monkeypatch.setenv("HETSCHED_EMULATE_COST", "0.3,0.001")
    (row,) = probe("mlp", "slow", [4], warmup=1, steps=1, device="cpu", sync=False).rows
    floor = 0.3 + 0.001 * 4
    assert row.step_time_s >= floor * 0.999 and row.optimizer_s is not None
    assert 0.0 <= row.optimizer_s <= max(0.0, row.step_time_s - floor) + 1e-6


# ---------------------------------------------------------------------------
# pool planning


def _problem(table: ThroughputTable, **kw: Any) -> tuple[PoolProblem, int, int]:
    jobs, cluster = load_jobs(EX / "jobs.yaml"), load_cluster(EX / "cluster.yaml")
    pp = PoolProblem(PlanningProblem(jobs, cluster, table), **kw)
    return pp, [j.workload for j in jobs].index("resnet-50"), pp.base.types.index("v100")


def _with_share(share: float) -> ThroughputTable:
    """Gavel's table with ``share`` s of optimizer in every resnet-50 row on v100."""
    gavel = load_throughputs(EX / "gavel_throughputs.csv")
    return ThroughputTable([replace(r, optimizer_s=share)
                            if (r.workload, r.gpu_type) == ("resnet-50", "v100") else r
                            for r in gavel.all_rows()])


def test_pool_task_iteration_excludes_the_optimizer_share() -> None:
    share = 0.004
    base, i, t = _problem(load_throughputs(EX / "gavel_throughputs.csv"), task_iterations=3)
    pp, _, _ = _problem(_with_share(share), task_iterations=3)
    assert pp.optimizer_s[i, t] == pytest.approx(share)
    # the iteration is the profiled step less the share ...
    assert pp.t_it[i, t] == pytest.approx(base.t_it[i, t] - share)
    # ... and, no overhead measured yet, the coordinator's step is on the round's sync path
    # once per round (spread over the task's N iterations)
    assert pp.N[i] * pp.s_it[i, t] == pytest.approx(pp.N[i] * base.s_it[i, t] + share)
    # every other (job, type) is planned as before
    other = np.isfinite(base.t_it)
    other[i, t] = False
    assert np.allclose(pp.t_it[other], base.t_it[other])
    assert np.allclose(pp.s_it[other], base.s_it[other])
    # space mode keeps the whole step: the base problem's step model is untouched
    b16 = np.full(pp.T, 16.0)
    assert np.allclose(pp.base.step_times(i, b16), base.base.step_times(i, b16))


def test_measured_overhead_holds_the_coordinators_step() -> None:
    """Once the executors' overhead is measured it contains the coordinator's optimizer
    step (the next round's task waits for it): not added to the sync path again."""
    share = 0.004
    table = _with_share(share)
    base, i, t = _problem(table, task_iterations=3)
    table.task_overhead_s = {("resnet-50", "v100"): 0.01}  # type: ignore[attr-defined]
    pp, _, _ = _problem(table, task_iterations=3)
    assert pp.s_it[i, t] == pytest.approx(base.s_it[i, t] - share / base.N[i])
    assert pp.N[i] * pp.t_it[i, t] == pytest.approx(pp.N[i] * base.t_it[i, t] + 0.01)


def test_a_share_above_a_small_batchs_fitted_step_keeps_a_floor() -> None:
    """Profiled at large batches (a line through the origin), the share measured there
    exceeds the fitted step at the task's smaller slice: the iteration keeps a floor."""
    rows = [ProfileRow("resnet-50", "v100", b, 0.001 * b, optimizer_s=0.4)
            for b in (512, 1024, 2048)]
    gavel = load_throughputs(EX / "gavel_throughputs.csv")
    table = ThroughputTable([r for r in gavel.all_rows()
                             if (r.workload, r.gpu_type, r.gpus) != ("resnet-50", "v100", 1)]
                            + rows)
    pp, i, t = _problem(table, task_iterations=3, choose_parallelism=False)
    step = 0.001 * int(pp.slice_b[i])
    assert step < 0.4
    assert pp.t_it[i, t] == pytest.approx(MIN_ITERATION_SHARE * step)


# ---------------------------------------------------------------------------
# the profile history


def _task(job: str, its: int, compute_s: float, batch: int = 64) -> str:
    return json.dumps({"kind": "task", "job": job, "round": 0, "task": 0, "gpu": "n1-g0",
                       "gpu_type": "v100", "iterations": its, "samples": its * batch,
                       "compute_s": compute_s, "switch_s": 0.0, "overhead_s": 0.002}) + "\n"


def test_history_keeps_the_share_beside_its_row(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, [ProfileRow("mlp", "v100", 64, 0.010, optimizer_s=0.002),
                         ProfileRow("mlp", "v100", 32, 0.006),
                         ProfileRow("cnn", "v100", 32, 0.020, optimizer_s=0.001)], "probe")
        got = {(r.workload, r.local_batch): r.optimizer_s for r in history_rows(st)}
        assert got == {("mlp", 64): 0.002, ("mlp", 32): None, ("cnn", 32): 0.001}
        assert "optimizer_s" in export_csv(st).splitlines()[0]
        fit = table_from_store(st).get("mlp", "v100")
        assert fit is not None and fit.optimizer_s == pytest.approx(0.002)
        # a row imported again without a share loses the old one (it may be another measure)
        import_rows(st, [ProfileRow("mlp", "v100", 64, 0.011)], "csv")
        assert {r.local_batch: r.optimizer_s for r in history_rows(st)
                if r.workload == "mlp"} == {32: None, 64: None}
        forget(st, workload="cnn")
        assert all(r.workload == "mlp" for r in history_rows(st))
        import_rows(st, [ProfileRow("cnn", "v100", 32, 0.020)], "csv")
        assert {r.workload: r.optimizer_s for r in history_rows(st)}["cnn"] is None


def test_fold_weight_grows_with_iterations() -> None:
    assert fold_weight(0.3, 1) == 0.3
    assert fold_weight(0.3, 2) == pytest.approx(1 - 0.7 ** 2)
    assert fold_weight(0.3, 5) == pytest.approx(1 - 0.7 ** 5)
    assert fold_weight(0.3, 1000) == MAX_TASK_ALPHA
    assert fold_weight(0.95, 3) == pytest.approx(0.95)  # never below alpha


def test_one_run_of_a_one_round_job_moves_the_step_most_of_the_way(tmp_path: Path) -> None:
    """One pool task of 40 iterations measured 4 ms an iteration against a profiled
    10 ms step with a 2 ms optimizer share: the row moves to 90 % of the way to the
    measured iteration plus the share (6 ms), and the pool plan follows it (4 ms).
    One record of one iteration moves it by alpha, as a run's ``steps`` record does."""
    rep = tmp_path / "gpu-n1-g0.jsonl"
    rep.write_text(_task("m", 40, 40 * 0.004))
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, [ProfileRow("mlp", "v100", 64, 0.010, optimizer_s=0.002)], "probe")
        changes = ingest_reports(st, [rep], workloads={"m": "mlp"})
        assert changes == [("mlp", "v100", 64, 0.010, pytest.approx(
            0.1 * 0.010 + 0.9 * (0.004 + 0.002)))]
        (row,) = history_rows(st)
        assert row.optimizer_s == 0.002  # the share stays beside the refined row
        gap = (0.010 - row.step_time_s) / (0.010 - 0.006)
        assert gap == pytest.approx(MAX_TASK_ALPHA)
        # a single-iteration record (and a run's steps record) moves it by alpha only
        rep2 = tmp_path / "gpu-n2-g0.jsonl"
        rep2.write_text(_task("m", 1, 0.004) + json.dumps(
            {"kind": "steps", "workload": "mlp", "gpu_type": "v100", "local_batch": 64,
             "compute_s": 0.006, "n": 10}) + "\n")
        before = row.step_time_s
        ingest_reports(st, [rep2], workloads={"m": "mlp"})
        (row,) = history_rows(st)
        a = DEFAULT_ALPHA
        after_task = (1 - a) * before + a * 0.006
        assert row.step_time_s == pytest.approx((1 - a) * after_task + a * 0.006)


def test_task_records_of_one_read_pool_over_their_iterations(tmp_path: Path) -> None:
    """A job's tasks in one report (20 iterations at 4 ms, then a short last round of 5 at
    8 ms: fixed costs over few iterations) fold once, as their iterations' mean (4.8 ms),
    with the weight of all 25; a later read folds again."""
    rep = tmp_path / "gpu-n1-g0.jsonl"
    rep.write_text(_task("m", 20, 20 * 0.004) + _task("m", 5, 5 * 0.008))
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, [ProfileRow("mlp", "v100", 64, 0.010, optimizer_s=0.002)], "probe")
        changes = ingest_reports(st, [rep], workloads={"m": "mlp"})
        w = fold_weight(DEFAULT_ALPHA, 25)
        first = (1 - w) * 0.010 + w * (0.0048 + 0.002)
        assert changes == [("mlp", "v100", 64, 0.010, pytest.approx(first))]
        with rep.open("a") as f:
            f.write(_task("m", 2, 2 * 0.004))
        changes = ingest_reports(st, [rep], workloads={"m": "mlp"})
        w2 = fold_weight(DEFAULT_ALPHA, 2)
        assert changes == [("mlp", "v100", 64, pytest.approx(first),
                            pytest.approx((1 - w2) * first + w2 * 0.006))]


def test_a_pool_task_without_a_known_share_folds_its_iteration(tmp_path: Path) -> None:
    """No share measured (an old profile): the record is the row's best measure as it
    stands, folded with the same weight."""
    rep = tmp_path / "gpu-n1-g0.jsonl"
    rep.write_text(_task("m", 40, 40 * 0.004))
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, [ProfileRow("mlp", "v100", 64, 0.010)], "csv")
        ingest_reports(st, [rep], workloads={"m": "mlp"})
        (row,) = history_rows(st)
        assert row.optimizer_s is None
        assert row.step_time_s == pytest.approx(0.1 * 0.010 + 0.9 * 0.004)
