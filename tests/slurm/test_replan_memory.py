"""Replan and cancel decisions on the in-memory Slurm (fast; testbed tests beside them)."""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import contract_plan, make_testbed_plan, throughput_rows

from hetsched.app.cancel import cancel_jobs
from hetsched.app.monitor import Monitor
from hetsched.app.replan import replan
from hetsched.app.submit import submit
from hetsched.core.throughput import ThroughputTable
from hetsched.io.jobfiles import JobFiles
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store

NODES = (("a100-1", "a100", 2), ("a100-2", "a100", 2), ("v100-1", "v100", 4),
         ("v100-2", "v100", 4), ("t4-1", "t4", 4))
TWO_JOBS = """jobs:
  - {name: A, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 2, max_gpus: 2, command: [train]}
  - {name: B, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [t4], min_gpus: 2, max_gpus: 2, command: [train]}
"""


def _setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, TWO_JOBS)
    st = open_store(tmp_path / "s.db")
    ids = dict(submit(plan, st, slurm).submitted)
    slurm.schedule()
    Monitor(st, slurm).poll()  # baseline: both running, nodes recorded
    return slurm, st, ids


def table() -> ThroughputTable:
    return ThroughputTable(throughput_rows())


def test_user_scancel_is_final(tmp_path: Path) -> None:
    slurm, st, ids = _setup(tmp_path)
    slurm.cancel([ids["A"]])  # the user's scancel, outside hetsched
    r = replan(st, slurm, table())
    assert "job-cancelled" in r.reason
    assert r.user_cancelled == ["A"] and r.submitted == []
    assert "cancelled by the user (final): A" in r.summary()
    assert slurm.count("sbatch") == 2  # A was not resubmitted
    again = replan(st, slurm, table(), force=True)
    assert "A" not in dict(again.submitted) and again.user_cancelled == ["A"]
    st.close()


def test_hetsched_cancel_records_why_and_sticks(tmp_path: Path) -> None:
    slurm, st, ids = _setup(tmp_path)
    res = cancel_jobs(st, slurm, ["B"], reason="wrong learning rate", user="alice")
    assert res.cancelled == [("B", ids["B"])]
    assert slurm.jobs_by_id[ids["B"]].state == "CANCELLED"
    ev = [e for e in st.events() if e["kind"] == "job-cancelled"]
    assert len(ev) == 1 and '"reason": "wrong learning rate"' in ev[0]["detail"]
    assert '"by": "alice"' in ev[0]["detail"]
    r = replan(st, slurm, table())
    assert r.user_cancelled == ["B"] and "B" not in dict(r.submitted)
    # the monitor does not turn hetsched's own cancel into a second event
    assert [e["kind"] for e in st.events()].count("job-cancelled") == 1
    st.close()


def test_pinned_job_on_a_down_type_waits_and_the_rest_is_replanned(tmp_path: Path) -> None:
    slurm, st, ids = _setup(tmp_path)
    slurm.node_down("v100-1")
    slurm.node_down("v100-2")  # A allows only v100: nowhere to go now
    slurm.finish(ids["B"], "FAILED", "NonZeroExitCode")
    logs: list[str] = []
    r = replan(st, slurm, table(), log=logs.append)
    assert r.status == "replanned", r.summary()  # not wedged on A
    assert [j for j, _ in r.waiting] == ["A"] and "v100" in r.waiting[0][1]
    assert [j for j, _ in r.submitted] == ["B"]
    assert any("job A: waits" in m for m in logs)
    assert any(e["kind"] == "job-waiting" and e["job"] == "A" for e in st.events())
    st.close()


def test_giving_up_is_said(tmp_path: Path) -> None:
    slurm, st, ids = _setup(tmp_path)
    logs: list[str] = []
    jid = ids["B"]
    for _ in range(2):
        slurm.finish(jid, "FAILED", "NonZeroExitCode")
        r = replan(st, slurm, table(), max_failures=1, log=logs.append)
        if r.submitted:
            jid = dict(r.submitted)["B"]
            slurm.schedule()
    assert r.gave_up_now == ["B"] and "gave up on B (retries exhausted)" in r.summary()
    assert any("job B: gave up: failed 2 times" in m for m in logs)
    assert any(e["kind"] == "job-given-up" for e in st.events())
    later = replan(st, slurm, table(), force=True, max_failures=1)
    assert later.given_up == ["B"] and later.gave_up_now == []
    st.close()


def test_replan_after_one_completion_changes_only_what_it_must(tmp_path: Path) -> None:
    slurm = MemorySlurm(nodes_spec=NODES)
    jobs = "jobs:\n" + "".join(
        f"  - {{name: q{i}, workload: w, dataset_size: {20000 + 5000 * i}, epochs: 1, "
        f"global_batch: 64, gpu_types: [v100, t4], min_gpus: 1, max_gpus: 2, "
        f"command: [train]}}\n" for i in range(8))
    plan = make_testbed_plan(slurm, jobs)
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()
        first = next(i for i in slurm.active() if slurm.jobs_by_id[i].state == "RUNNING")
        slurm.finish(first)
        before = {n: slurm.jobs_by_id[i].state for n, i in ids.items()}
        r = replan(st, slurm, table())
        cancelled = {j for j, _ in r.cancelled}
        moved = {c.job for c in r.changes if c.was != c.now and "dependency" not in c.why}
        assert cancelled <= moved  # nothing cancelled whose allocation stayed
        assert all(before[j] != "RUNNING" for j in cancelled)  # fifo: running ones stay
        for name in r.kept:  # kept jobs keep their Slurm id (and queue age)
            assert latest_rows_id(st, name) == ids[name]
        for name, sid in r.updated:  # pending jobs changed in place keep theirs too
            assert sid == ids[name] == latest_rows_id(st, name) and name not in cancelled
        assert {c.job for c in r.changes if "updated in place" in c.why} == \
            {n for n, _ in r.updated}
        assert all(c.was != c.now for c in r.changes)


def latest_rows_id(st, name: str) -> str | None:  # type: ignore[no-untyped-def]
    from hetsched.app.replan import latest_rows

    return latest_rows(st)[name].slurm_id


def _batch(weight_b: float) -> str:
    """X holds the 8 v100s briefly; A runs on t4 meanwhile (v100 would be twice as fast);
    B (weight ``weight_b``) needs all 8 v100s. When X ends: keep A on t4 and start B on
    the v100s, or move A there (60 s restart) and make B wait for it?"""
    return f"""jobs:
  - {{name: X, workload: w, dataset_size: 20000, epochs: 1, global_batch: 64,
     gpu_types: [v100], min_gpus: 8, max_gpus: 8, command: [train]}}
  - {{name: A, workload: w, dataset_size: 100000, epochs: 1, global_batch: 64,
     gpu_types: [v100, t4], min_gpus: 2, max_gpus: 2, command: [train]}}
  - {{name: B, workload: w, dataset_size: 400000, epochs: 1, global_batch: 64,
     weight: {weight_b}, gpu_types: [v100], min_gpus: 8, max_gpus: 8, command: [train]}}
"""


def _x_ends_and_replan(tmp_path: Path, weight_b: float):  # type: ignore[no-untyped-def]
    """Submit the batch (srtf: preemptive), run X and A, end X, replan: (the submitted
    plan, the replan's result, the Slurm ids)."""
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, _batch(weight_b), policy="srtf")
    st = open_store(tmp_path / "s.db")
    ids = dict(submit(plan, st, slurm).submitted)
    slurm.schedule()
    Monitor(st, slurm).poll()
    assert {n: slurm.jobs_by_id[i].state for n, i in ids.items()} == \
        {"X": "RUNNING", "A": "RUNNING", "B": "PENDING"}
    slurm.finish(ids["X"])
    r = replan(st, slurm, table())
    st.close()
    return plan, r, ids


def _a_on(plan: dict, i: int) -> set[str]:  # type: ignore[type-arg]
    a = next(j for j in plan["jobs"] if j["name"] == "A")
    return {w["gpu_type"] for w in a["segments"][i]["workers"]}


def test_a_move_that_delays_a_heavier_job_is_not_made(tmp_path: Path) -> None:
    """A alone would gain from the v100s (its new end plus the restart beats its end on
    t4: the per-job rule moved it), but B (weight 2) would wait for them: the batch's
    weighted completion is worse, so A is kept and B starts on the v100s."""
    from hetsched.planning.planner import make_plan
    from hetsched.slurm.inventory import load_cluster_from_slurm

    _, r, ids = _x_ends_and_replan(tmp_path, weight_b=2.0)
    assert r.plan is not None, r.summary()
    rec = r.plan["keep_or_move"]
    assert rec["chosen"] == "keep" and rec["started"] == ["A"], rec
    assert rec["weighted_completion_s"]["keep"] < rec["weighted_completion_s"]["fresh"]
    assert _a_on(r.plan, 0) == {"t4"} and r.plan["jobs"][0]["segments"][0]["restart_s"] == 0
    assert "A" in r.kept and ids["A"] not in {i for _, i in r.cancelled}
    assert not any(c.job == "A" for c in r.changes)
    # the per-job rule would have moved A: planned as if it were not running, it gets
    # the v100s and ends, restart included, before it ends where it runs
    work = [jp.spec for jp in plan_from(r.plan).jobs if jp.spec is not None]
    cluster = load_cluster_from_slurm(MemorySlurm(nodes_spec=NODES), "gpu")
    free = make_plan(work, cluster, table(), policy="srtf", restart_cost_s=60.0)
    kept_end = next(j["end_s"] for j in r.plan["jobs"] if j["name"] == "A")
    assert {w.gpu_type for w in free.job("A").segments[0].workers} == {"v100"}
    assert free.job("A").end_s + 60.0 < kept_end


def plan_from(d: dict):  # type: ignore[no-untyped-def,type-arg]
    from hetsched.io.plan_json import plan_from_dict

    return plan_from_dict(d, "replan")


def test_a_move_that_pays_for_the_batch_is_made(tmp_path: Path) -> None:
    """The same state with B light (weight 0.1): moving A pays for the batch; the
    change row says why in the decision's terms."""
    _, r, ids = _x_ends_and_replan(tmp_path, weight_b=0.1)
    assert r.plan is not None, r.summary()
    rec = r.plan["keep_or_move"]
    assert rec["chosen"] == "fresh", rec
    assert _a_on(r.plan, 0) == {"v100"}
    assert r.plan["jobs"][[j["name"] for j in r.plan["jobs"]].index("A")][
        "segments"][0]["restart_s"] == 60.0
    assert ("A", ids["A"]) in r.cancelled and "A" in dict(r.submitted)
    row = next(c for c in r.changes if c.job == "A")
    s = rec["weighted_completion_s"]
    assert row.why == (f"running; moving pays: weighted completion {s['fresh']:.0f} s (fresh) "
                       f"instead of {s['keep']:.0f} s (keep), restart 60 s included"), row
    assert row.was == "t4-1:2" and row.now.startswith("v100")


def test_replan_does_what_the_simulated_plan_did_at_the_same_event(tmp_path: Path) -> None:
    """The plan the batch was submitted with simulated X's end too: its A stays on t4
    (B heavy) or moves to the v100s (B light) there. Replan at that event, from
    Slurm's state, gives the same answer: one rule, not two."""
    for weight_b in (2.0, 0.1):
        sub = tmp_path / str(weight_b)
        sub.mkdir()
        plan, r, _ = _x_ends_and_replan(sub, weight_b)
        a, x_end = plan.job("A"), plan.job("X").end_s
        sim_moves = any(seg.start_s == x_end and {w.gpu_type for w in seg.workers} == {"v100"}
                        for seg in a.segments)
        assert r.plan is not None
        assert sim_moves == (r.plan["keep_or_move"]["chosen"] == "fresh")
        assert sim_moves == ("A" in dict(r.submitted)) == (_a_on(r.plan, 0) == {"v100"})
        assert sim_moves == (weight_b < 1.0)  # both cases occur


def test_online_replan_keeps_a_running_job_where_moving_would_pay(tmp_path: Path) -> None:
    """Online, the running jobs stay where they run until they end, in the plan as in
    Slurm: the same state where moving A pays keeps it, and B plans around it."""
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, _batch(0.1), policy="srtf")
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(plan, st, slurm).submitted)
        slurm.schedule()
        Monitor(st, slurm).poll()
        slurm.finish(ids["X"])
        r = replan(st, slurm, table(), online=True)
        assert r.plan is not None, r.summary()
        held = {(w["node"], w["gpu"]) for w in st.submissions(job="A")[-1].workers}
    a = next(j for j in r.plan["jobs"] if j["name"] == "A")
    assert len(a["segments"]) == 1 and a["segments"][0]["restart_s"] == 0
    assert {(w["node"], w["gpu"]) for w in a["segments"][0]["workers"]} == held
    assert "A" in r.kept and not r.cancelled
    assert r.plan["keep_or_move"]["started"] == ["A"]


def test_a_running_job_the_plan_could_not_start_where_it_runs_is_kept() -> None:
    """decide_changes follows the plan for the running jobs it started where they run
    (the note's ``started``); one it did not (a co-location group's shared GPUs) is
    kept whatever the plan says: replan pays no restart the decision did not weigh."""
    from hetsched.app.replan_changes import decide_changes
    from hetsched.state.store import Submission

    plan = contract_plan("mv1", {"R": [[("v100-1", "v100", 32), ("v100-1", "v100", 32)]]})
    row = Submission(1, "old", "R", 0, "77", "RUNNING", "", "",
                     [{"node": "t4-1", "gpu_type": "t4", "gpu": 0, "local_batch": 64}], 0, 0)
    kw = {"failed": frozenset({"FAILED"}), "running": frozenset({"RUNNING"})}
    d = decide_changes(plan, {"R": row}, restart_cost_s=60.0, **kw)
    assert d.to_submit == set() and d.kept == ["R"] and d.changes == []
    plan.notes.keep_or_move = {"chosen": "fresh", "started": ["R"],
                               "weighted_completion_s": {"keep": 500.0, "fresh": 160.0}}
    d = decide_changes(plan, {"R": row}, restart_cost_s=60.0, **kw)
    assert d.to_submit == {"R"} and [r.slurm_id for r in d.to_cancel] == ["77"]
    assert d.changes[0].why.startswith("running; moving pays: weighted completion 160 s")
    # paused: the same GPU, but only from 100 s on (the plan lets another job go first)
    paused = contract_plan("mv2", {"R": [[("t4-1", "t4", 64)]]})
    paused.jobs[0].segments[0].start_s = 100.0
    paused.notes.keep_or_move = plan.notes.keep_or_move
    d = decide_changes(paused, {"R": row}, restart_cost_s=60.0, **kw)
    assert d.to_submit == {"R"} and d.changes[0].why.endswith("; waits until 100 s")
    paused.jobs[0].segments[0].start_s = 0.0  # runs on from where it is: kept
    d = decide_changes(paused, {"R": row}, restart_cost_s=60.0, **kw)
    assert d.kept == ["R"] and d.changes == []


TL_JOB = """jobs:
  - {name: T, workload: w, dataset_size: 100000, target_loss: 0.5, global_batch: 64,
     gpu_types: [v100], min_gpus: 2, max_gpus: 2, command: [train]}
"""


def _history_reports(d: Path, runs: int = 3, epochs: int = 20) -> list[Path]:
    """Completed runs' rank-0 ``epoch`` and ``done`` records (what the trainer writes)."""
    import json

    paths = []
    for r in range(runs):
        p = d / f"h{r}.jsonl"
        recs = [{"kind": "epoch", "job": f"h{r}", "rank": 0, "epoch": e,
                 "dataset_size": 100000, "first_loss": 2.0, "loss": 2.0 / (1 + e + r)}
                for e in range(epochs)] + [{"kind": "done", "job": f"h{r}", "rank": 0}]
        p.write_text("".join(json.dumps(x) + "\n" for x in recs))
        paths.append(p)
    return paths


def test_replan_predicts_a_running_target_loss_jobs_rest(tmp_path: Path) -> None:
    """Half its planned (prior, 10 epoch) time has passed: replan says it ran ~5 epochs
    and plans the rest the store's history predicts (runs took 20), not 5 more."""
    import time

    import pytest

    from hetsched.state.history import ingest_reports

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, TL_JOB)
    jp = plan.jobs[0]
    assert jp.spec is not None and jp.spec.epochs == 10 and jp.spec.epochs_predicted
    half = 0.5 * (jp.end_s - jp.start_s)
    st = open_store(tmp_path / "s.db")
    submit(plan, st, slurm)
    slurm.clock = lambda: time.time() - half  # it started half its planned time ago
    slurm.schedule()
    slurm.clock = time.time
    Monitor(st, slurm).poll()
    ingest_reports(st, _history_reports(tmp_path))
    r = replan(st, slurm, table(), force=True)
    assert r.plan is not None, r.summary()
    pred = r.plan["length_prediction"]
    assert pred["predictor_points"] == 3 * 20
    t = pred["jobs"]["T"]
    assert 4.5 < t["epochs_done"] < 5.5, t
    spec = next(j["spec"] for j in r.plan["jobs"] if j["name"] == "T")
    assert spec["epochs_predicted"] is True
    assert spec["epochs"] == pytest.approx(t["epochs_planned"], abs=1e-5)
    assert t["epochs_planned"] == pytest.approx(t["expected_total"] - t["epochs_done"],
                                                abs=1e-5)
    assert 8.0 < spec["epochs"] < 30.0, t  # not the prior's 5 left
    st.close()


MOVABLE_TL_JOB = """jobs:
  - {name: B, workload: w, dataset_size: 100000, epochs: 50, global_batch: 64,
     gpu_types: [a100], min_gpus: 4, max_gpus: 4, command: [train]}
""" + TL_JOB.split("\n", 1)[1].replace("gpu_types: [v100]", "gpu_types: [a100, t4]")


def _started_ago(slurm: MemorySlurm, seconds: float) -> None:
    """Start what is queued as if it had started ``seconds`` ago."""
    import time

    slurm.clock = lambda: time.time() - seconds
    slurm.schedule()
    slurm.clock = time.time


def test_epochs_done_accumulate_across_replans(tmp_path: Path) -> None:
    """T runs half its prior plan on t4 (B holds the a100s); B ends and replan 1 moves
    T to the a100s (it ran ~5 epochs); it runs half its new plan there; replan 2 counts both parts,
    not only the epochs run since it moved (the rest of the spec is all the new plan
    knows: the count is carried in the plan's ``epochs_done``). ``las`` preempts: the
    keep-or-move decision may move T (a non-preemptive policy keeps running jobs)."""
    import pytest

    from hetsched.state.history import ingest_reports

    slurm = MemorySlurm(nodes_spec=NODES)
    p0 = make_testbed_plan(slurm, MOVABLE_TL_JOB, policy="las")
    t0 = p0.job("T")
    assert t0.segments[0].workers[0].gpu_type == "t4" and t0.start_s == 0.0
    st = open_store(tmp_path / "s.db")
    ids = dict(submit(p0, st, slurm).submitted)
    _started_ago(slurm, 0.5 * (t0.end_s - t0.start_s))
    slurm.finish(ids["B"])
    Monitor(st, slurm).poll()
    ingest_reports(st, _history_reports(tmp_path))
    r1 = replan(st, slurm, table(), force=True)
    assert r1.plan is not None and [j for j, _ in r1.submitted] == ["T"], r1.summary()
    assert [j for j, _ in r1.cancelled] == ["T"], r1.changes  # moved to the a100s
    t1 = r1.plan["length_prediction"]["jobs"]["T"]
    assert 4.5 < t1["epochs_done"] < 5.5, t1
    j1 = next(j for j in r1.plan["jobs"] if j["name"] == "T")
    assert {w["gpu_type"] for s in j1["segments"] for w in s["workers"]} == {"a100"}
    _started_ago(slurm, 0.5 * (j1["end_s"] - j1["start_s"]))  # half its new plan there
    Monitor(st, slurm).poll()
    r2 = replan(st, slurm, table(), force=True)
    assert r2.plan is not None, r2.summary()
    t2 = r2.plan["length_prediction"]["jobs"]["T"]
    want = t1["epochs_done"] + 0.5 * j1["spec"]["epochs"]
    assert t2["epochs_done"] == pytest.approx(want, rel=0.05), (t1, t2)
    assert t2["epochs_planned"] == pytest.approx(t2["expected_total"] - t2["epochs_done"],
                                                 abs=1e-5)
    assert j1["epochs_done"] == pytest.approx(t1["epochs_done"], abs=1e-5)  # carried
    j2 = next(j for j in r2.plan["jobs"] if j["name"] == "T")
    assert j2["epochs_done"] == pytest.approx(t2["epochs_done"], abs=1e-5)
    st.close()


def test_replan_counts_a_running_jobs_own_epoch_reports(tmp_path: Path) -> None:
    """T reported 7 epochs (rank 0, no ``done`` yet): replan takes them over the
    elapsed-time estimate (~5); a finished run of the same name does not count, nor an
    earlier batch's unfinished run of it (12 epochs)."""
    import json

    from hetsched.state.history import ingest_reports

    slurm = MemorySlurm(nodes_spec=NODES)
    plan = make_testbed_plan(slurm, TL_JOB)
    jp = plan.jobs[0]
    st = open_store(tmp_path / "s.db")
    pid = submit(plan, st, slurm).plan_id
    _started_ago(slurm, 0.5 * (jp.end_s - jp.start_s))
    Monitor(st, slurm).poll()
    own = JobFiles(tmp_path / "s.db.files", pid, "T", 0, pid).report  # its batch's report
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text("".join(json.dumps(
        {"kind": "epoch", "job": "T", "rank": r, "epoch": e, "dataset_size": 100000,
         "first_loss": 2.0, "loss": 2.0 / (1 + e)}) + "\n" for e in range(7) for r in (0, 1)))
    # an earlier batch's run of T that never finished (cancelled at epoch 11): not this one
    old = JobFiles(tmp_path / "s.db.files", "earlier", "T", 0, "earlier").report
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("".join(json.dumps(
        {"kind": "epoch", "job": "T", "rank": 0, "epoch": e, "dataset_size": 100000,
         "first_loss": 2.0, "loss": 2.0 / (1 + e)}) + "\n" for e in range(12)))
    ingest_reports(st, [*_history_reports(tmp_path), own, old])
    r = replan(st, slurm, table(), force=True)
    assert r.plan is not None, r.summary()
    t = r.plan["length_prediction"]["jobs"]["T"]
    assert t["epochs_done"] == 7.0, t
    from hetsched.state.progress import epochs_reported, run_key

    # h0..h2 finished: not running; the earlier batch's T is its own run
    assert epochs_reported(st) == {run_key(own, "T"): 7, run_key(old, "T"): 12}
    assert next(j for j in r.plan["jobs"] if j["name"] == "T")["epochs_done"] == 7.0
    st.close()


def test_status_asks_for_replan_only_while_a_job_is_not_final(tmp_path: Path) -> None:
    """Events left after the user cancelled the whole batch need no replan (nothing to do)."""
    from hetsched.app.status import batch_status, replan_has_work

    slurm, st, ids = _setup(tmp_path)
    cancel_jobs(st, slurm, ["A"])
    assert st.events(unhandled_only=True)
    assert replan_has_work(batch_status(st, slurm))  # B still runs
    cancel_jobs(st, slurm, ["B"])
    assert not replan_has_work(batch_status(st, slurm))
    st.close()


def test_cancel_leaves_a_job_that_already_ended(tmp_path: Path) -> None:
    """The state file is behind Slurm (no poll since B ended): its end is not overwritten."""
    from hetsched.app.status import batch_status

    slurm, st, ids = _setup(tmp_path)
    slurm.finish(ids["B"])  # COMPLETED in Slurm; the store still says RUNNING
    res = cancel_jobs(st, slurm, None)
    assert res.cancelled == [("A", ids["A"])]
    assert res.not_active == [("B", "COMPLETED")]
    assert slurm.jobs_by_id[ids["A"]].state == "CANCELLED"
    assert {j.job: j.state for j in batch_status(st, slurm)} == {"A": "CANCELLED",
                                                                  "B": "COMPLETED"}
    Monitor(st, slurm).poll()
    assert {r.job: r.state for r in st.submissions()} == {"A": "CANCELLED", "B": "COMPLETED"}
    assert [e["job"] for e in st.events() if e["kind"] == "job-cancelled"] == ["A"]
    st.close()


def test_cancel_leaves_a_job_slurm_no_longer_lists(tmp_path: Path) -> None:
    """Ended longer ago than MinJobAge: squeue forgot it; cancelling it would guess how."""
    slurm, st, ids = _setup(tmp_path)
    slurm.finish(ids["B"])
    del slurm.jobs_by_id[ids["B"]]  # what MinJobAge does to an ended job
    res = cancel_jobs(st, slurm, ["A", "B"])
    assert res.cancelled == [("A", ids["A"])]
    assert res.not_active == [("B", "ended; Slurm no longer lists it")]
    assert {r.job: r.state for r in st.submissions()}["B"] == "RUNNING"  # the monitor's to say
    st.close()


def test_failures_count_within_the_jobs_own_batch(tmp_path: Path) -> None:
    """A second batch reusing a job name starts with no failures: B failed once in the
    first batch; in the second its first failure is resubmitted, not given up."""
    slurm, st, ids = _setup(tmp_path)
    plan = make_testbed_plan(slurm, TWO_JOBS)
    slurm.finish(ids["B"], "FAILED", "NonZeroExitCode")
    r = replan(st, slurm, table(), max_failures=1)
    assert [j for j, _ in r.submitted] == ["B"]
    slurm.schedule()
    slurm.finish(ids["A"])
    slurm.finish(dict(r.submitted)["B"])
    Monitor(st, slurm).poll()

    second = submit(plan, st, slurm)  # the first batch ran to its end: a new batch
    assert second.plan_id.endswith(".2")
    slurm.schedule()
    slurm.finish(dict(second.submitted)["B"], "FAILED", "NonZeroExitCode")
    r = replan(st, slurm, table(), max_failures=1)
    assert r.gave_up_now == [] and [j for j, _ in r.submitted] == ["B"], r.summary()
    st.close()


def test_a_spooled_job_may_reuse_a_finished_jobs_name_not_a_live_ones(tmp_path: Path) -> None:
    """A finished, B running: a spooled A is a new job (a new Slurm job, its own batch,
    nothing taken from the old A); a spooled B is left out and said; the file is retired."""
    slurm, st, ids = _setup(tmp_path)
    slurm.finish(ids["A"])
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "more.yaml").write_text(TWO_JOBS)
    r = replan(st, slurm, table(), spool=spool)
    assert [j for j, _ in r.submitted] == ["A"], r.summary()
    assert dict(r.submitted)["A"] != ids["A"] and "B" in r.kept
    assert r.spool_ignored == [("B", "more.yaml")]
    assert "spool: left out (a job of that name is queued or running): B (more.yaml)" \
        in r.summary()
    assert (spool / "done" / "more.yaml").exists() and not (spool / "more.yaml").exists()
    new = st.active_plan()
    assert new is not None and new["batches"].get("A") is None  # its own batch: the new plan
    assert new["batches"]["B"] == st.submissions(job="B")[0].plan_id
    [old_a, new_a] = st.submissions(job="A")
    assert old_a.state == "COMPLETED" and new_a.plan_id == new["plan_id"]


def test_a_spool_file_of_live_names_only_is_said_and_retired(tmp_path: Path) -> None:
    slurm, st, ids = _setup(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "again.yaml").write_text(TWO_JOBS)
    r = replan(st, slurm, table(), spool=spool)
    assert r.submitted == [] and sorted(r.spool_ignored) == [("A", "again.yaml"),
                                                             ("B", "again.yaml")]
    assert (spool / "done" / "again.yaml").exists()


def test_a_spool_file_that_does_not_load_is_rejected_and_never_wedges(tmp_path: Path) -> None:
    """A bad jobs file is said (naming the file and field), moved to rejected/, and the
    pass goes on: B's failure is still resubmitted, and the next pass is quiet."""
    slurm, st, ids = _setup(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "bad.yaml").write_text("jobs: [{name: x, workload: w}]\n")
    slurm.finish(ids["B"], "FAILED", "NonZeroExitCode")
    r = replan(st, slurm, table(), spool=spool)
    assert [j for j, _ in r.submitted] == ["B"], r.summary()
    assert len(r.spool_rejected) == 1 and "bad.yaml" in r.spool_rejected[0]
    assert "dataset_size" in r.spool_rejected[0] and "rejected" in r.summary()
    assert (spool / "rejected" / "bad.yaml").exists() and not (spool / "bad.yaml").exists()
    why = (spool / "rejected" / "bad.yaml.why").read_text()
    assert "rejected: " in why and "dataset_size" in why and why.count("\n") == 1
    assert replan(st, slurm, table(), spool=spool).status == "unchanged"


def test_a_spooled_job_that_cannot_be_placed_is_kept_not_lost(tmp_path: Path) -> None:
    """Of a spooled file, C (a type no node has) waits: it alone is kept in
    SPOOL/waiting/ (said), D is submitted, the file is retired; put back, C loads again."""
    slurm, st, ids = _setup(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "more.yaml").write_text(
        "slurm: {time: '01:00:00'}\n" + TWO_JOBS.replace("name: A", "name: C").replace(
            "gpu_types: [v100]", "gpu_types: [h100]").replace("name: B", "name: D"))
    r = replan(st, slurm, table(), spool=spool)
    assert [j for j, _ in r.submitted] == ["D"], r.summary()
    kept = spool / "waiting" / "more.yaml"
    assert r.spool_waiting == [("C", str(kept))] and [j for j, _ in r.waiting] == ["C"]
    assert f"spool: kept in {kept}, to put back in the spool once it can run: C" \
        in r.summary()
    assert (spool / "done" / "more.yaml").exists()
    why = (spool / "waiting" / "more.yaml.why").read_text()
    assert "C waits, cannot be placed now: " in why and "h100" in why, why
    assert not (spool / "done" / "more.yaml.why").exists()
    from hetsched.io.specs import load_jobs

    [c] = load_jobs(kept)
    assert c.name == "C" and c.gpu_types == ("h100",) and c.slurm is not None
    for f in (spool / "waiting").iterdir():  # the user puts both back: mv waiting/* .
        f.rename(spool / f.name)
    r = replan(st, slurm, table(), spool=spool)
    assert [j for j, _ in r.waiting] == ["C"] and r.spool_waiting == [("C", str(kept))]
    assert not (spool / "more.yaml.why").exists() and (spool / "waiting" / "more.yaml.why"
                                                       ).exists()


def test_a_dry_run_says_where_spool_files_would_go_and_moves_none(tmp_path: Path) -> None:
    """--dry-run: a bad file and an unplaceable job are said in the conditional ("would
    be"), both files stay where they are, and a real pass then moves them."""
    slurm, st, ids = _setup(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "bad.yaml").write_text("jobs: [{name: x, workload: w}]\n")
    (spool / "more.yaml").write_text(TWO_JOBS.replace("name: A", "name: C").replace(
        "gpu_types: [v100]", "gpu_types: [h100]").replace("name: B", "name: D"))
    r = replan(st, slurm, table(), spool=spool, dry_run=True)
    kept = spool / "waiting" / "more.yaml"
    assert "spool: rejected (would be moved to rejected/): " in r.summary(), r.summary()
    assert f"spool: would be kept in {kept}, to put back" in r.summary()
    assert sorted(f.name for f in spool.iterdir()) == ["bad.yaml", "more.yaml"]
    assert not list(spool.rglob("*.why"))
    r = replan(st, slurm, table(), spool=spool)
    assert "spool: rejected (moved to rejected/): " in r.summary()
    assert f"spool: kept in {kept}, to put back" in r.summary()
    assert (spool / "rejected" / "bad.yaml").exists() and kept.exists()


def test_the_same_jobs_file_spooled_again_is_a_second_batch(tmp_path: Path) -> None:
    """A retired file's mark is forgotten: the same bytes at the same path later (a
    nightly batch of one jobs file) are read again, not skipped as already seen."""
    slurm, st, ids = _setup(tmp_path)
    spool = tmp_path / "spool"
    spool.mkdir()
    more = TWO_JOBS.replace("name: A", "name: C").replace("name: B", "name: D")
    (spool / "nightly.yaml").write_text(more)
    first = dict(replan(st, slurm, table(), spool=spool).submitted)
    assert set(first) == {"C", "D"} and (spool / "done" / "nightly.yaml").exists()
    slurm.schedule()
    for jid in first.values():
        slurm.finish(jid)
    Monitor(st, slurm, spool=spool).poll()
    (spool / "nightly.yaml").write_text(more)  # the same file, the next night
    again = dict(replan(st, slurm, table(), spool=spool).submitted)
    assert set(again) == {"C", "D"} and not set(again.values()) & set(first.values())
    assert sorted(f.name for f in (spool / "done").iterdir()) == ["nightly-2.yaml",
                                                                  "nightly.yaml"]
