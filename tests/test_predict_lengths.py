"""Every policy plans a target_loss job at the progress predictor's length (planning/lengths.py).

Hand-made history: completed runs of 4 epochs; their (features, k/E) points
are what ``state.progress.progress_points`` returns (the real-SQLite version is
in tests/runtime/test_progress_history.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hetsched.core.efficiency import PRIOR_EPOCHS, features
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, parse_jobs
from hetsched.planning.lengths import predict_lengths
from hetsched.planning.planner import make_plan

ROOT = Path(__file__).resolve().parents[1]
RUN_EPOCHS = 4


def _history(sizes: tuple[int, ...] = (192, 256, 320)) -> tuple[np.ndarray, np.ndarray]:
    X = [features(s, k) for s in sizes for k in range(1, RUN_EPOCHS + 1)]
    y = [k / RUN_EPOCHS for _ in sizes for k in range(1, RUN_EPOCHS + 1)]
    return np.array(X), np.array(y)


def _jobs() -> list:
    return parse_jobs({"jobs": [
        {"name": "tl", "workload": "resnet-18", "dataset_size": 256, "target_loss": 0.5,
         "global_batch": 32},
        {"name": "ep", "workload": "resnet-18", "dataset_size": 256, "epochs": 6,
         "global_batch": 32}]}, "jobs")


def test_a_new_job_gets_the_predicted_length_a_known_one_is_untouched() -> None:
    jobs = _jobs()
    assert jobs[0].epochs == PRIOR_EPOCHS and jobs[0].epochs_predicted
    out, rec = predict_lengths(jobs, _history())
    assert rec is not None and rec["predictor_points"] == 3 * RUN_EPOCHS
    tl, ep = out
    assert tl.epochs_predicted and tl.epochs != PRIOR_EPOCHS
    assert 2.0 < tl.epochs < 8.0, tl.epochs  # the runs took 4 epochs
    assert ep == jobs[1]  # known epochs: the same job
    assert rec["jobs"] == {"tl": {"epochs_done": 0.0, "expected_total": pytest.approx(
        tl.epochs, rel=1e-5), "epochs_planned": pytest.approx(tl.epochs, rel=1e-5)}}


def test_a_job_that_has_run_plans_the_expected_rest() -> None:
    out, rec = predict_lengths(_jobs(), _history(), epochs_done={"tl": 2.0})
    assert rec is not None
    r = rec["jobs"]["tl"]
    assert r["epochs_done"] == 2.0
    assert out[0].epochs == pytest.approx(r["expected_total"] - 2.0, rel=1e-5)
    assert 0.5 < out[0].epochs < 6.0, r  # about 2 of 4 epochs left


def test_under_one_epoch_the_new_job_estimate_less_what_ran() -> None:
    new, _ = predict_lengths(_jobs(), _history())
    out, rec = predict_lengths(_jobs(), _history(), epochs_done={"tl": 0.25})
    assert rec is not None and rec["jobs"]["tl"]["expected_total"] == pytest.approx(
        new[0].epochs, rel=1e-5)
    assert out[0].epochs == pytest.approx(new[0].epochs - 0.25, rel=1e-5)


def test_without_enough_history_nothing_changes() -> None:
    jobs = _jobs()
    for hist in (None, (_history()[0][:2], _history()[1][:2])):
        out, rec = predict_lengths(jobs, hist)
        assert out is jobs and rec is None
    known = [jobs[1]]  # no target_loss job: the history is not even fitted
    assert predict_lengths(known, _history()) == (known, None)


@pytest.mark.parametrize("policy", ["fifo", "has"])
def test_every_policy_and_the_evaluator_plan_the_prediction(policy: str) -> None:
    cluster = load_cluster(ROOT / "examples" / "cluster.yaml")
    table = load_throughputs(ROOT / "examples" / "gavel_throughputs.csv")
    prior = make_plan(_jobs(), cluster, table, policy=policy)
    pred = make_plan(_jobs(), cluster, table, policy=policy, progress_history=_history())
    spec = {j.name: j.spec for j in pred.jobs}
    assert spec["tl"].epochs_predicted and spec["tl"].epochs < PRIOR_EPOCHS
    assert spec["ep"].epochs == 6
    assert pred.notes.length_prediction["predictor_points"] == 3 * RUN_EPOCHS
    assert prior.notes.length_prediction is None
    assert {j.name: j.spec for j in prior.jobs}["tl"].epochs == PRIOR_EPOCHS
    # the evaluator simulated the shorter job: it ends sooner than with the prior
    end = {j.name: j.end_s for j in pred.jobs}["tl"]
    assert end < {j.name: j.end_s for j in prior.jobs}["tl"]
    d = pred.to_dict()
    assert d["length_prediction"]["jobs"]["tl"]["epochs_planned"] == pytest.approx(
        spec["tl"].epochs, rel=1e-5)
