"""`hetsched status` on the in-memory Slurm: where a job runs, actual beside predicted,
the failed job's log, the slow flag, and the current batch (with earlier batches' jobs
still queued) unless --all.

(tests/slurm/test_status.py runs status on the real testbed.)
"""

from __future__ import annotations

from pathlib import Path

from slurm_helpers import contract_plan

from hetsched.app.status import SLOW, batch_status
from hetsched.app.submit import files_dir, submit
from hetsched.cli.tables import UNLIMITED, status_notes, status_table
from hetsched.slurm.memory import MemorySlurm
from hetsched.state.store import open_store


def _text(jobs: list) -> str:
    from rich.console import Console

    con = Console(width=UNLIMITED, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(status_table(jobs, UNLIMITED))
    return con.export_text() + "\n".join(status_notes(jobs))


def test_status_says_where_when_and_how_it_is_doing(tmp_path: Path) -> None:
    clock = [0.0]
    slurm = MemorySlurm(clock=lambda: clock[0])
    with open_store(tmp_path / "s.db") as st:
        ids = dict(submit(contract_plan("b1", {"ok": [[("t4-1", "t4", 4), ("t4-1", "t4", 4)]],
                                               "bad": [[("v100-1", "v100", 4)]]}),
                          st, slurm, partition="gpu").submitted)
        t0 = float(st.plans()[-1]["created"])
        pred = {j["name"]: j for j in st.active_plan()["jobs"]}  # type: ignore[index]
        clock[0] = t0 + 1
        slurm.schedule()
        # "ok" ends after twice its predicted JCT: flagged; "bad" fails at once
        clock[0] = t0 + 2 * (pred["ok"]["end_s"] - pred["ok"]["arrival_s"])
        slurm.finish(ids["ok"])
        slurm.finish(ids["bad"], "FAILED", "NonZeroExitCode")
        log = files_dir(st) / "logs" / f"bad-{ids['bad']}.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("Traceback ...\nValueError: no data at /d\n"
                       "srun: error: v100-1: task 0: Exited with exit code 1\n")
        jobs = {j.job: j for j in batch_status(st, slurm, now=clock[0])}

    ok, bad = jobs["ok"], jobs["bad"]
    assert ok.placement == "t4-1:0,1" and bad.placement == "v100-1:0"
    assert ok.actual_start == int(t0 + 1) and ok.actual_end == int(clock[0])  # Slurm: seconds
    assert ok.predicted_jct_s is not None and ok.measured_jct_s is not None
    assert ok.measured_jct_s > SLOW * ok.predicted_jct_s and "JCT" in ok.slow
    assert bad.state == "FAILED" and bad.log == str(log) and not bad.slow
    assert ok.log is None
    text = _text(list(jobs.values()))
    assert "t4-1:0,1" in text and "COMPLETED !" in text
    assert bad.cause == "ValueError: no data at /d" and ok.cause == ""
    assert f"bad failed: log {log} (last line: ValueError: no data at /d)" in text
    assert "! ok: JCT 2.0x the prediction" in text


def test_status_shows_the_current_batch_unless_all(tmp_path: Path) -> None:
    """--all: every batch's run of each job, a job name the later batch reused twice."""
    slurm = MemorySlurm()
    with open_store(tmp_path / "s.db") as st:
        first = dict(submit(contract_plan("old", {"o1": [[("t4-1", "t4", 4)]]}), st, slurm,
                            partition="gpu").submitted)
        slurm.schedule()
        slurm.finish(first["o1"])
        second = dict(submit(contract_plan("new", {"n1": [[("t4-1", "t4", 4)]],
                                                   "o1": [[("v100-1", "v100", 4)]]}),
                             st, slurm, partition="gpu", allow_active_elsewhere=True).submitted)
        slurm.schedule()
        now = [(j.job, j.plan_id) for j in batch_status(st, slurm)]
        every = batch_status(st, slurm, all_batches=True)
    assert now == [("n1", "new"), ("o1", "new")]
    assert [(j.job, j.plan_id, j.state) for j in every] == [
        ("n1", "new", "RUNNING"), ("o1", "old", "COMPLETED"), ("o1", "new", "RUNNING")]
    assert first["o1"] != second["o1"]
    assert " plan " in _text(every) and " plan " not in _text(
        [j for j in every if j.plan_id == "new"])


def test_status_also_shows_earlier_batches_still_in_the_queue(tmp_path: Path) -> None:
    """A second batch submitted while the first still runs hides neither."""
    slurm = MemorySlurm(nodes_spec=(("a100-1", "a100", 2), ("t4-1", "t4", 4), ("v100-1", "v100", 4),
                                    ("v100-2", "v100", 4)))
    with open_store(tmp_path / "s.db") as st:
        first = dict(submit(contract_plan("old", {"o1": [[("v100-1", "v100", 4)]],
                                                  "o2": [[("v100-2", "v100", 4)]]}),
                            st, slurm, partition="gpu").submitted)
        slurm.schedule()
        slurm.finish(first["o2"])  # o1 still runs, o2 is done
        submit(contract_plan("new", {"n1": [[("t4-1", "t4", 4)]]}), st, slurm, partition="gpu",
               allow_active_elsewhere=True)
        shown = {j.job: j for j in batch_status(st, slurm)}
        assert set(shown) == {"n1", "o1"}
        assert shown["o1"].plan_id == "old" and shown["o1"].state == "RUNNING"
        assert " plan " in _text(list(shown.values()))  # which batch each job is of
        from hetsched.app.monitor import Monitor
        from hetsched.app.status import batch_counts

        Monitor(st, slurm).poll()
        c = batch_counts(st)  # watch's counts: the jobs status shows
        assert (c["running"], c["pending"], c["done"]) == (1, 1, 0), c  # o1, n1; not o2
        slurm.finish(first["o1"])
        assert {j.job for j in batch_status(st, slurm)} == {"n1"}
        Monitor(st, slurm).poll()
        assert (batch_counts(st)["running"], batch_counts(st)["pending"]) == (0, 1)


def test_slow_ratios_never_read_as_the_threshold() -> None:
    """A job flagged at 1.504x its prediction says 1.50x, not "1.5x (more than 1.5x)"."""
    from hetsched.app.status import SLOW, _times

    assert _times(1.504) == "1.50x" and _times(1.549) == "1.55x"
    assert _times(1.56) == "1.6x" and _times(33.0) == "33.0x"
    assert SLOW == 1.5


def test_slow_needs_a_minute_over_the_prediction_besides_the_ratio() -> None:
    """Start-up is not in the plan: a 20 s job that takes 50 s is not flagged, a 200 s
    job that takes 400 s is, by JCT and by run time alike; iterations by ratio alone."""
    from hetsched.app.status import SLOW_GRACE_S, JobStatus, _slow

    def job(state: str, **kw: float) -> JobStatus:
        return JobStatus("j", "p", "1", state, "", "", None, None, None, None, None, **kw)

    assert _slow(job("COMPLETED", predicted_jct_s=20.0, measured_jct_s=50.0), 20.0) == ""
    assert "JCT 2.0x" in _slow(job("COMPLETED", predicted_jct_s=200.0, measured_jct_s=400.0),
                                200.0)
    tiny = job("RUNNING")
    tiny.elapsed_s = 20.0 + SLOW_GRACE_S  # 4x its predicted 20 s, exactly a minute over
    assert _slow(tiny, 20.0) == ""
    tiny.elapsed_s += 1.0
    assert "running 4.0x" in _slow(tiny, 20.0)
    quick = job("RUNNING")
    quick.measured_iter_s, quick.predicted_iter_s = 0.02, 0.01
    assert "iterations 2.0x" in _slow(quick, None)
