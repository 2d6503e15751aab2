"""ONES's progress predictor learns from completed jobs in the state store (schema v3).

Real runs of the trainer (one CPU rank) write the reports; a real SQLite store
folds their ``epoch`` and ``done`` records; the planner gets the points
through ``PlanningProblem.progress_history`` and ``hetsched plan`` reads them
from the state file.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hetsched.core.efficiency import features
from hetsched.core.problem import PlanningProblem
from hetsched.io.profiles import load_throughputs
from hetsched.io.reports import iter_records
from hetsched.io.specs import load_cluster, parse_jobs
from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies.base import make_policy
from hetsched.planning.space.policies.ones_predict import fit_history
from hetsched.runtime.launcher import RankEnv
from hetsched.runtime.trainer import TrainConfig, train
from hetsched.state import store as store_mod
from hetsched.state.history import ingest_reports
from hetsched.state.progress import completed_runs, progress_points
from hetsched.state.store import open_store

ROOT = Path(__file__).resolve().parents[2]
ONE = RankEnv(0, 1, 0, "local", "127.0.0.1", 0)
EPOCHS = 4


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three completed runs of 4 epochs (different data sizes) and one stopped early."""
    d = tmp_path_factory.mktemp("reports")
    for k, size in enumerate((192, 256, 320)):
        train(TrainConfig(job=f"done{k}", workload="mlp", dataset_size=size, epochs=EPOCHS,
                          local_batches=[32], report=str(d / f"done{k}.jsonl"), device="cpu",
                          seed=k), ONE)
    train(TrainConfig(job="cut", workload="mlp", dataset_size=256, epochs=EPOCHS,
                      local_batches=[32], report=str(d / "cut.jsonl"), device="cpu",
                      max_steps=12), ONE)
    return d


def test_completed_runs_become_training_points(reports: Path, tmp_path: Path) -> None:
    files = sorted(reports.glob("*.jsonl"))
    with open_store(tmp_path / "state.db") as st:
        ingest_reports(st, files)
        assert completed_runs(st) == 3  # the stopped run's length is unknown: left out
        X, y = progress_points(st)
        assert X.shape == (3 * EPOCHS, 5)
        assert sorted(set(np.round(y, 6))) == [0.25, 0.5, 0.75, 1.0]
        # features: epoch size, the run's initial loss, epochs done, loss improvement
        assert sorted(set(np.round(np.expm1(X[:, 0])))) == [192, 256, 320]
        assert np.isfinite(X[:, 1]).all() and (X[:, 3] > 0).any()
        ingest_reports(st, files)  # each record counts once (report offsets)
        X2, _ = progress_points(st)
        assert X2.shape == X.shape
        runs = st.conn.execute("SELECT COUNT(*) FROM progress_runs").fetchone()[0]
        assert runs == 4  # the stopped run is kept, without a length


def test_the_predictor_learns_the_length_of_completed_jobs(reports: Path,
                                                           tmp_path: Path) -> None:
    with open_store(tmp_path / "state.db") as st:
        ingest_reports(st, sorted(reports.glob("*.jsonl")))
        hist = progress_points(st)
    model = fit_history(hist)
    assert model is not None and model.n_train == 3 * EPOCHS
    for f in sorted(reports.glob("done*.jsonl")):  # the runs' own epochs: 4 - k left
        ep = list(iter_records(f, "epoch"))
        left = [model.mean_remaining(features(r["dataset_size"], r["epoch"] + 1,
                                              ep[0]["first_loss"], r["loss"]),
                                     done=r["epoch"] + 1) for r in ep]
        assert len(left) == EPOCHS and left[0] > left[2] > left[3], left
        assert 0.8 < left[1] < 3.5, left  # after 2 of 4 epochs, about 2 are left
    assert fit_history(None) is None and fit_history((hist[0][:2], hist[1][:2])) is None


def _problem(hist: tuple[np.ndarray, np.ndarray] | None) -> PlanningProblem:
    jobs = parse_jobs({"jobs": [
        {"name": "tl", "workload": "resnet-18", "dataset_size": 20000, "target_loss": 0.5,
         "global_batch": 128},
        {"name": "ep", "workload": "resnet-18", "dataset_size": 20000, "epochs": 6,
         "global_batch": 128, "arrival_s": 30}]}, "jobs")
    return PlanningProblem(jobs, load_cluster(ROOT / "examples" / "cluster.yaml"),
                           load_throughputs(ROOT / "examples" / "gavel_throughputs.csv"),
                           progress_history=hist)


def test_ones_uses_the_history_it_is_given(reports: Path, tmp_path: Path) -> None:
    with open_store(tmp_path / "state.db") as st:
        ingest_reports(st, sorted(reports.glob("*.jsonl")))
        hist = progress_points(st)
    pol = make_policy("ones", {"seed": 2})
    with_h = simulate(_problem(hist), pol)
    assert with_h.extra["ones"]["predictor_points"] == 3 * EPOCHS
    assert pol.remaining.model is not None
    without = simulate(_problem(None), make_policy("ones", {"seed": 2}))
    assert without.extra["ones"]["predictor_points"] == 0


@pytest.mark.slow
def test_plan_reads_the_history_from_the_state_file(reports: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.db"
    with open_store(state) as st:
        ingest_reports(st, sorted(reports.glob("*.jsonl")))
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {name: tl, workload: resnet-18, dataset_size: 20000, target_loss: 0.5,"
        " global_batch: 128}\n")
    exe = shutil.which("hetsched")
    assert exe
    r = subprocess.run([exe, "plan", str(tmp_path / "jobs.yaml"), "--cluster",
                        str(ROOT / "examples" / "cluster.yaml"), "--throughputs",
                        str(ROOT / "examples" / "gavel_throughputs.csv"), "--policy", "ones",
                        "--format", "json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "HETSCHED_STATE": str(state)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ones"]["predictor_points"] == 3 * EPOCHS


@pytest.mark.slow
def test_every_policy_plans_the_predicted_length_from_the_state_file(reports: Path,
                                                                     tmp_path: Path) -> None:
    """fifo (no predictor of its own) plans a target_loss job at the predicted length;
    without the state file it keeps the prior."""
    state = tmp_path / "state.db"
    with open_store(state) as st:
        ingest_reports(st, sorted(reports.glob("*.jsonl")))
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {name: tl, workload: resnet-18, dataset_size: 256, target_loss: 0.5,"
        " global_batch: 32}\n  - {name: ep, workload: resnet-18, dataset_size: 256,"
        " epochs: 6, global_batch: 32}\n")
    exe = shutil.which("hetsched")
    assert exe
    docs = {}
    for key, path in (("with", state), ("without", tmp_path / "absent.db")):
        r = subprocess.run([exe, "plan", str(tmp_path / "jobs.yaml"), "--cluster",
                            str(ROOT / "examples" / "cluster.yaml"), "--throughputs",
                            str(ROOT / "examples" / "gavel_throughputs.csv"), "--policy",
                            "fifo", "--format", "json"], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "HETSCHED_STATE": str(path)})
        assert r.returncode == 0, r.stderr
        docs[key] = json.loads(r.stdout)
    spec = {j["name"]: j["spec"] for j in docs["with"]["jobs"]}
    assert spec["tl"]["epochs_predicted"] is True
    assert 2.0 < spec["tl"]["epochs"] < 8.0, spec["tl"]  # the completed runs took 4 epochs
    assert spec["ep"]["epochs"] == 6 and "epochs_predicted" not in spec["ep"]
    assert docs["with"]["length_prediction"]["predictor_points"] == 3 * EPOCHS
    prior = {j["name"]: j["spec"] for j in docs["without"]["jobs"]}
    assert prior["tl"]["epochs"] == 10 and "length_prediction" not in docs["without"]


def test_a_version_2_file_migrates_to_the_progress_tables(tmp_path: Path) -> None:
    p = tmp_path / "v2.db"
    conn = sqlite3.connect(p)
    for stmt in store_mod.SCHEMA.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    for stmt in store_mod.MIGRATIONS[2]:
        conn.execute(stmt)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [
        ("application", "hetsched"), ("schema_version", "2"), ("created", "0")])
    conn.commit()
    conn.close()
    ro = store_mod.open_store_readonly(p)  # read-only: not migrated, no history
    assert ro is not None and progress_points(ro)[1].size == 0
    ro.close()
    with open_store(p) as st:
        assert st.schema_version == store_mod.SCHEMA_VERSION == 3
        assert completed_runs(st) == 0


def test_a_resumed_runs_epochs_count_on_until_it_completes(tmp_path: Path) -> None:
    """What replan measures k from: a run cut mid-epoch and resumed from its checkpoint
    into the same report file counts on from the checkpoint's epoch; once it completes
    it is history, no longer a running job's count."""
    from hetsched.state.progress import epochs_reported, run_key

    rep, ck = tmp_path / "res.jsonl", tmp_path / "res.ckpt"
    cfg = {"job": "res", "workload": "mlp", "dataset_size": 256, "epochs": EPOCHS,
           "local_batches": [32], "report": str(rep), "device": "cpu",
           "checkpoint": str(ck)}  # 8 steps an epoch
    with open_store(tmp_path / "state.db") as st:
        train(TrainConfig(**cfg, max_steps=12), ONE)  # epoch 0 done, half of epoch 1
        ingest_reports(st, [rep])
        assert epochs_reported(st) == {run_key(rep, "res"): 1}
        train(TrainConfig(**cfg, max_steps=12), ONE)  # resumed: to step 24, epochs 1, 2
        ingest_reports(st, [rep])
        assert epochs_reported(st) == {run_key(rep, "res"): 3}
        assert completed_runs(st) == 0
        train(TrainConfig(**cfg), ONE)  # the rest: epoch 3, done
        ingest_reports(st, [rep])
        assert epochs_reported(st) == {} and completed_runs(st) == 1
        assert progress_points(st)[1].tolist() == [0.25, 0.5, 0.75, 1.0]
