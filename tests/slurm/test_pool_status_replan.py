"""Fast checks of the pool status and replan pieces (no Slurm; real plans, files, SQLite).

The testbed tests (test_pool_e2e.py) run them end to end; these pin down the
parts that are easy to get subtly wrong: counting rounds after a resume,
keeping the round numbering across a replan, and the remaining iterations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from pool_slurm_helpers import (
    EMULATE_COST,
    EMULATE_SPEED,
    THREE_JOBS,
    UNEVEN_LAYOUT,
    cluster_yaml,
    emulated_rows,
    pool_plan,
    report_rounds,
    uneven_plan,
)

from hetsched.app.pool_replan import (
    _new_plan,
    _remaining,
    as_uneven,
    iterations_left,
    renumber,
    round_iterations,
    steps_before,
)
from hetsched.app.pool_status import ingest_pool_reports, progress
from hetsched.app.pool_submit import PoolDirs, _write_sidecar
from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import (
    COLUMNS,
    UNEVEN_COLUMNS,
    TaskRun,
    fused_steps,
    row_from_list,
)
from hetsched.core.spec import Cluster
from hetsched.core.throughput import ThroughputTable
from hetsched.io.plan_json import plan_from_dict
from hetsched.io.pool_reports import read_pool_reports, report_path
from hetsched.io.reports import ReportWriter
from hetsched.io.specs import parse_cluster, parse_jobs
from hetsched.state.store import open_store

NODES = [("a100-1", "a100", 1), ("v100-1", "v100", 1)]


def expand_runs(runs: list[dict]) -> list[list]:
    """A plan file's runs of one GPU, expanded to stored rows (the core type's expansion)."""
    return [row.to_list() for run in runs
            for row in TaskRun(tuple(row_from_list(r) for r in run["tasks"]), run["repeat"],
                               run.get("period_s"), run.get("round_step")).expand()]


def _write_tasks(report_dir: Path, body: dict, upto: dict[str, int], t0: float = 1000.0,
                 done: set[str] = frozenset(), stretch: float = 1.0) -> None:
    """Task records as executors write them, for each job's rounds below ``upto[job]``
    (every time ``stretch`` times the plan's)."""
    meta = body["tasks"]["jobs"]
    last_end: dict[str, float] = {}  # a done job's end: its last round's last task
    for g in body["tasks"]["gpus"]:
        rep = ReportWriter(report_path(report_dir, body["plan_id"], f"{g['node']}-g{g['gpu']}"))
        for row in expand_runs(g["runs"]):
            job, rnd, task = row[0], int(row[1]), int(row[2])
            start, end = stretch * row[3], stretch * row[4]
            if rnd >= upto.get(job, 0):
                continue
            n, b = meta[job]["iterations_per_task"], meta[job]["local_batch"]
            if len(row) > 8:  # an uneven task's own batch and iterations
                b, n = int(row[8]), int(row[9])
            # its steps in passes of the plan's chunk, as the executor reports them
            m = fused_steps((meta[job].get("chunk") or {}).get(g["gpu_type"]), b, n)
            rep.write("task", job=job, round=rnd, task=task, gpu=f"{g['node']}-g{g['gpu']}",
                      gpu_type=g["gpu_type"], iterations=-(-n // m), samples=n * b,
                      compute_s=(end - start), switch_s=0.001, start=t0 + start, end=t0 + end)
            if job in done and rnd == meta[job]["rounds"] - 1:
                last_end[job] = max(last_end.get(job, 0.0), end)
    for job, end in last_end.items():  # the coordinator's record, once the round is in
        rep.write("job_done", job=job, rounds=meta[job]["rounds"], end=t0 + end)


@contextlib.contextmanager
def _running_pool(tmp_path: Path, monkeypatch, prefix: str,  # type: ignore[no-untyped-def]
                  db: str = "s.db", plan: Plan | None = None):
    """A pool plan of NODES submitted to an in-memory Slurm and started: (store, Slurm,
    plan, the stored plan)."""
    from hetsched.app.pool_submit import submit_pool
    from hetsched.slurm.memory import MemorySlurm

    monkeypatch.setenv("HETSCHED_SPOOL", str(tmp_path / "spool"))
    slurm = MemorySlurm(nodes_spec=NODES)
    plan = plan or pool_plan(NODES, prefix=prefix, task_iterations=5)
    with open_store(tmp_path / db) as st:
        submit_pool(plan, st, slurm, partition="gpu")
        slurm.schedule()
        body = st.active_plan()
        assert body is not None
        yield st, slurm, plan, body


def test_progress_counts_rounds_tasks_and_measured_jct(tmp_path: Path) -> None:
    body = pool_plan(NODES, prefix="st", task_iterations=5).to_dict()
    meta = body["tasks"]["jobs"]
    a, b, c = (f"st{x}" for x in "abc")
    upto = {a: meta[a]["rounds"], b: 1, c: meta[c]["rounds"]}
    _write_tasks(tmp_path, body, upto, done={a, c})
    prog = progress(plan_from_dict(body), read_pool_reports(tmp_path, body["plan_id"]), "7",
                    now=1001.0)
    by = {j.job: j for j in prog.jobs}
    for name in (a, c):  # finished exactly as planned: measured JCT = planned JCT
        assert by[name].done and by[name].rounds_done == meta[name]["rounds"]
        assert by[name].measured_jct_s == pytest.approx(
            next(j["jct_s"] for j in body["jobs"] if j["name"] == name), abs=1e-3)
    assert not by[b].done and by[b].rounds_done == 1 and by[b].measured_jct_s is None
    # the plan's own rows count the tasks (a round of uneven tasks may hold fewer)
    rows = [r for g in body["tasks"]["gpus"] for r in expand_runs(g["runs"]) if r[0] == b]
    assert by[b].tasks_done == sum(1 for r in rows if int(r[1]) == 0)
    assert by[b].tasks == len(rows)
    assert by[b].elapsed_s == pytest.approx(1.0)
    assert prog.measured_weighted_jct_s is None  # not every job is done
    line = by[b].line()
    assert f"round 2 of {meta[b]['rounds']} (1 done; the plan has " in line and "running" in line
    assert by[a].line().startswith(f"{a}: done (round {meta[a]['rounds']} of ")


def test_progress_says_how_many_rounds_the_plan_has_done_by_now(tmp_path: Path) -> None:
    """A running job's line says where the plan has it at the same time from the pool's
    first task: level with its rounds when it runs as planned, ahead of them when it
    runs twice as slow."""
    body = pool_plan(NODES, prefix="pn", task_iterations=5).to_dict()
    meta = body["tasks"]["jobs"]
    name = max(meta, key=lambda n: meta[n]["rounds"])
    assert meta[name]["rounds"] >= 4
    rows = [row_from_list(r) for g in body["tasks"]["gpus"] for r in expand_runs(g["runs"])]
    first = min(r.start_s for r in rows)
    end_of = {k: max(r.sync_end_s for r in rows if r.job == name and r.round == k)
              for k in range(meta[name]["rounds"])}
    for stretch, sub in ((1.0, "asis"), (2.0, "slow")):
        upto = {name: 2}
        _write_tasks(tmp_path / sub, body, upto, stretch=stretch)
        t0 = 1000.0 + stretch * first
        now = 1000.0 + stretch * end_of[1]  # the second round's last task has just ended
        prog = progress(plan_from_dict(body), read_pool_reports(tmp_path / sub, body["plan_id"]),
                        None, now=now)
        jp = next(j for j in prog.jobs if j.job == name)
        want = sum(1 for e in end_of.values() if e <= first + (now - t0) + 1e-9)
        assert jp.rounds_done == 2 and jp.planned_rounds_done == want
        assert f"(2 done; the plan has {want} done by now)" in jp.line()
        if stretch == 1.0:
            assert want == 2  # as planned: level
        else:
            assert want > 2  # twice as slow: behind the plan
    done = progress(plan_from_dict(body), read_pool_reports(tmp_path / "none", body["plan_id"]),
                    None, now=2000.0)
    assert all(j.planned_rounds_done is None for j in done.jobs)  # nothing started


def test_renumbered_replan_keeps_rounds_and_loads(tmp_path: Path) -> None:
    from hetsched.planning.planner import make_plan

    old = pool_plan(NODES, prefix="rn", task_iterations=5)
    assert old.tasks is not None
    meta = old.tasks.jobs
    done = {"rna": 2, "rnb": 1, "rnc": 0}
    own = round_iterations(old.tasks)
    jobs = [_remaining(j.spec, iterations_left(old, own, j.name, done[j.name]))  # type: ignore[arg-type]
            for j in old.jobs]
    for j in jobs:  # exactly the iterations after the completed rounds
        m = meta[j.name]
        total = (m.rounds - 1) * m.iterations_per_task + m.last_round_iterations
        assert j.iterations == pytest.approx(total - done[j.name] * m.iterations_per_task)
    new = make_plan(jobs, _cluster(), ThroughputTable(emulated_rows()), policy="hare",
                    mode="pool", task_iterations=5)
    assert new.tasks is not None
    ahead = {name: m.rounds for name, m in new.tasks.jobs.items()}
    renumber(new, done)
    body = new.to_dict()
    own_new = round_iterations(new.tasks)
    for name, m in body["tasks"]["jobs"].items():
        # the job's whole life: its completed rounds, then the new plan's (which may
        # split the rest into other rounds than the old plan did: uneven tasks)
        assert m["rounds"] == done[name] + ahead[name]
        rows = [r for g in body["tasks"]["gpus"] for r in expand_runs(g["runs"])
                if r[0] == name]
        assert sorted({int(r[1]) for r in rows}) == list(range(done[name], m["rounds"]))
        # ... and from the resume point on exactly the iterations that were left
        spec = next(j for j in jobs if j.name == name)
        assert iterations_left(new, own_new, name, done[name]) == pytest.approx(spec.iterations)
    # the executor reads it: every job's rounds from its resume point on
    exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
    xp = exec_plan(plan_from_dict(body, "replanned"))
    for name, j in xp.jobs.items():
        assert j.rounds == body["tasks"]["jobs"][name]["rounds"] and j.iterations == 5
        assert min(t.round for g in xp.gpus.values() for t in g.tasks if t.job == name) \
            == done[name]


def _cluster() -> Cluster:
    return parse_cluster(cluster_yaml(NODES), "test")


def _step_samples(xj: object, rounds: range) -> dict[int, list[int]]:
    """Per global step of a job's ``rounds``, the samples its tasks train (all tasks)."""
    np = pytest.importorskip("numpy")
    task_indices = pytest.importorskip("hetsched.runtime.executor.iteration").task_indices
    out: dict[int, list[int]] = {}
    for r in rounds:
        for k in range(xj.round_iterations(r)):  # type: ignore[attr-defined]
            idx = np.concatenate([task_indices(xj, 7, r, t, k)
                                  for t in range(xj.tasks_in(r))])  # type: ignore[attr-defined]
            out[xj.round_step(r) + k] = sorted(idx.tolist())  # type: ignore[attr-defined]
    return out


def _replanned(old: Plan, done: dict[str, int]) -> tuple[Plan, dict[str, int]]:
    """The old plan's remaining work after ``done`` rounds, replanned (as replan does) and
    read back as the stored plan is; and the steps each job had run."""
    own = round_iterations(old.tasks)  # type: ignore[arg-type]
    steps = {n: steps_before(old, own, n, k) for n, k in done.items()}
    jobs = [_remaining(j.spec, iterations_left(old, own, j.name, done[j.name]))  # type: ignore[arg-type]
            for j in old.jobs]
    new = _new_plan(old, jobs, done, _cluster(), ThroughputTable(emulated_rows()), None, steps)
    return plan_from_dict(new.to_dict(), "replanned"), steps


@pytest.mark.parametrize("space", ["seed", "off"])  # the new plan uneven, or equal slices
def test_uneven_replan_goes_on_at_the_step_each_job_reached(space: str) -> None:
    """A job's rounds of different iterations and task counts: the remaining iterations
    are exact, the replanned plan starts the job's sampler at the step it reached (not
    rounds x task size), and every later step trains the samples it would have."""
    exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
    old = uneven_plan("uv")
    assert old.settings is not None
    old.settings = dataclasses.replace(old.settings, params={"space": space})
    a, b = "uva", "uvb"
    own = round_iterations(old.tasks)  # type: ignore[arg-type]
    done = {a: 5, b: 2}  # a's rounds 3 and 4 ran 3 and 2 iterations on one GPU
    assert [own[a][r] for r in range(5)] == [5, 5, 5, 3, 2]
    assert {n: iterations_left(old, own, n, k) for n, k in done.items()} == {a: 80, b: 25}
    new, steps = _replanned(old, done)
    assert steps == {a: 20, b: 10}  # a: not 5 rounds x 5
    assert new.tasks is not None and tuple(new.tasks.columns or ()) == UNEVEN_COLUMNS
    assert new.notes.resume == {n: {"plan_id": old.plan_id, "rounds_done": done[n],
                                    "iterations_done": steps[n]} for n in done}
    assert {j.name: round(j.spec.iterations, 6) for j in new.jobs  # type: ignore[union-attr]
            } == {a: 80, b: 25}
    xo, xn = exec_plan(old), exec_plan(new)
    for n, k in done.items():
        xj = xn.jobs[n]
        assert min(t.round for g in xn.gpus.values() for t in g.tasks if t.job == n) == k
        assert xj.round_step(k) == steps[n] == xo.jobs[n].round_step(k)
        assert sum(xj.round_iterations(r) for r in range(k, xj.rounds)) \
            == iterations_left(old, own, n, k)
        whole = _step_samples(xo.jobs[n], range(xo.jobs[n].rounds))
        rest = _step_samples(xj, range(k, xj.rounds))
        assert rest == {s: v for s, v in whole.items() if s >= steps[n]}
    # a second replan counts from where the first one started the job
    own2, k2 = round_iterations(new.tasks), done[a] + 3
    s2 = steps_before(new, own2, a, k2)
    assert s2 == xn.jobs[a].round_step(k2) > steps[a]
    assert iterations_left(new, own2, a, k2) == sum(n for n, _ in UNEVEN_LAYOUT) - s2
    again, steps2 = _replanned(new, {a: k2, b: done[b]})
    assert steps2[a] == s2 and exec_plan(again).jobs[a].round_step(k2) == s2


def test_equal_round_replan_resumes_at_rounds_times_task_size() -> None:
    """Equal rounds (rows of 8 values): the step reached is rounds x task size, and the
    replanned plan keeps equal rows."""
    from hetsched.planning.planner import make_plan

    exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
    jobs = parse_jobs(yaml.safe_load(THREE_JOBS % {"p": "eq"}), "test")
    old = make_plan(jobs, _cluster(), ThroughputTable(emulated_rows()), policy="hare",
                    params={"space": "off"}, mode="pool", task_iterations=5)
    old = plan_from_dict(old.to_dict(), "equal plan")
    assert old.tasks is not None and tuple(old.tasks.columns or ()) == COLUMNS
    done = {"eqa": 3, "eqb": 1, "eqc": 0}
    new, steps = _replanned(old, done)
    assert steps == {n: 5 * k for n, k in done.items()}
    assert new.tasks is not None and tuple(new.tasks.columns or ()) == COLUMNS
    xo, xn = exec_plan(old), exec_plan(new)
    for n, k in done.items():
        assert xn.jobs[n].round_step(k) == 5 * k and xn.jobs[n].layout is None
        whole = _step_samples(xo.jobs[n], range(xo.jobs[n].rounds))
        rest = _step_samples(xn.jobs[n], range(k, xn.jobs[n].rounds))
        assert rest == {s: v for s, v in whole.items() if s >= steps[n]}


def test_equal_rows_written_uneven_train_the_same_slices() -> None:
    """``as_uneven`` gives each row the equal slice and iterations it trained; a run whose
    repeats reach a shorter last round is written out row by row."""
    from hetsched.planning.planner import make_plan

    exec_plan = pytest.importorskip("hetsched.runtime.executor.plan").exec_plan
    text = ("jobs:\n  - {name: ava, workload: mlp, dataset_size: 992, epochs: 1, "
            "global_batch: 16, requested_gpus: 2, max_gpus: 2}\n"  # 62 iterations: last 2
            "  - {name: avb, workload: mlp, dataset_size: 400, epochs: 1, global_batch: 8}\n")
    plan = make_plan(parse_jobs(yaml.safe_load(text), "test"), _cluster(),
                     ThroughputTable(emulated_rows()), policy="hare",
                     params={"space": "off"}, mode="pool", task_iterations=5)
    assert plan.tasks is not None and plan.tasks.jobs["ava"].last_round_iterations == 2
    eq = exec_plan(plan_from_dict(plan.to_dict(), "equal"))
    tasks = plan.tasks
    before = [(g.id, r) for g in tasks.gpus for r in g.rows()]
    as_uneven(tasks, {j.name: j.spec for j in plan.jobs})  # type: ignore[misc]
    body = plan.to_dict()
    assert body["tasks"]["columns"] == list(UNEVEN_COLUMNS)
    assert body["tasks"]["stored_rows"] == sum(len(run["tasks"]) for g in body["tasks"]["gpus"]
                                               for run in g["runs"])
    assert [(g.id, r[:8]) for g in tasks.gpus for r in g.rows()] == \
        [(i, r[:8]) for i, r in before]
    un = exec_plan(plan_from_dict(body, "uneven"))
    for n, xj in eq.jobs.items():
        assert xj.layout is None and un.jobs[n].layout is not None
        for r in range(xj.rounds + 1):
            assert un.jobs[n].round_step(r) == (xj.round_step(r) if r < xj.rounds else
                                                sum(map(xj.round_iterations, range(r))))
        for r in range(xj.rounds):
            assert un.jobs[n].round_iterations(r) == xj.round_iterations(r)
            assert un.jobs[n].slices(r) == xj.slices(r)


def test_status_counts_each_uneven_round_by_its_own_tasks(tmp_path: Path) -> None:
    """Rounds of one task count as done once that task reported; a round of two with one
    reported does not."""
    plan = uneven_plan("us")
    a = "usa"
    report_rounds(tmp_path, plan, {a: 5, "usb": 2}, partial={a: 5})
    prog = progress(plan, read_pool_reports(tmp_path, str(plan.plan_id)), None, now=1001.0)
    by = {j.job: j for j in prog.jobs}
    assert by[a].rounds_done == 5 and by["usb"].rounds_done == 2
    assert by[a].tasks_done == 3 * 2 + 1 + 1 + 1
    assert by[a].tasks == sum(len(b) for _, b in UNEVEN_LAYOUT)
    assert f"round 6 of {len(UNEVEN_LAYOUT)} (5 done;" in by[a].line()


def test_monitor_folds_pool_task_records_into_the_history(tmp_path: Path) -> None:
    plan = pool_plan(NODES, prefix="hi", task_iterations=5)
    body = plan.to_dict()
    with open_store(tmp_path / "state.db") as st:
        st.add_plan(body)
        dirs = PoolDirs(tmp_path / "reports", tmp_path / "ckpt")
        _write_sidecar(st, body["plan_id"], dirs, "1")
        _write_tasks(dirs.report_dir, body, {j.name: 1 for j in plan.jobs})
        ingest_pool_reports(st)
        rows = {(r["workload"], r["gpu_type"], r["local_batch"]): r for r in st.profiles()}
        assert rows and all(w == "mlp" for w, _, _ in rows)
        a, c = EMULATE_COST
        # the plan's task times are the emulated ones; a task's passes may differ in size
        # (the last holds the rest), and the history keeps their mean at a whole batch
        for (_, g, b), r in rows.items():
            assert r["step_time_s"] == pytest.approx((a + c * b) / EMULATE_SPEED[g], rel=0.03)
        n = sum(int(r["samples"]) for r in rows.values())
        ingest_pool_reports(st)  # read from the stored offsets: nothing counted twice
        assert sum(int(r["samples"]) for r in st.profiles()) == n


def test_status_json_of_a_pool_plan_is_serialisable(tmp_path: Path) -> None:
    body = pool_plan(NODES, prefix="sj", task_iterations=5).to_dict()
    prog = progress(plan_from_dict(body), read_pool_reports(tmp_path, body["plan_id"]), None,
                    now=0.0)
    d = json.loads(json.dumps(prog.to_dict()))
    assert {j["job"] for j in d["jobs"]} == {"sja", "sjb", "sjc"}
    assert all(j["rounds_done"] == 0 and j["tasks_done"] == 0 for j in d["jobs"])
    assert dataclasses.asdict(prog.jobs[0])["elapsed_s"] is None


@pytest.mark.slurm
def test_space_replan_leaves_a_pool_plans_jobs_alone(
        testbed: object, client: object, clean_queue: None, tmp_path: Path) -> None:
    """After a space plan became active, a failed pool plan's jobs are not resubmitted as
    space hetjobs (they belong to their pool plan)."""
    from slurm_helpers import contract_plan

    from hetsched.app.replan import replan

    body = pool_plan(NODES, prefix="ml", task_iterations=5).to_dict()
    with open_store(tmp_path / "state.db") as st:
        st.add_plan(body)
        for j in body["jobs"]:
            sub = st.begin_submission(body["plan_id"], j["name"], 0, "x", "", [])
            st.set_submitted(sub.id, "999998", "RUNNING")  # Slurm forgot it: GONE
        st.add_plan(contract_plan("space1", {"other": [[("t4-1", "t4", 4)]]},
                                  policy="fifo").to_dict())
        r = replan(st, client, ThroughputTable(emulated_rows()), partition="gpu",  # type: ignore[arg-type]
                   force=True)
        assert r.submitted == [] and r.status == "unchanged", r.summary()
        assert {s.job for s in st.submissions()} == {j["name"] for j in body["jobs"]}


def test_status_shows_a_pool_jobs_measured_iteration_once_it_ended(
        tmp_path: Path, monkeypatch) -> None:
    """`status`'s "iter s" for a pool job: its span from its first task to its end over its
    iterations, the same span as the plan's iteration_s, so a job that ran as planned
    shows the prediction and one that ran slower is flagged; "-" while it runs."""
    from hetsched.app.pool_status import ended_jobs, iteration_s
    from hetsched.app.pool_submit import pool_dirs
    from hetsched.app.status import SLOW, batch_status

    with _running_pool(tmp_path, monkeypatch, "mi") as (st, slurm, plan, body):
        a, b, c = (j.name for j in plan.jobs)
        meta = body["tasks"]["jobs"]
        _write_tasks(pool_dirs(st, body["plan_id"]).report_dir, body,
                     {a: meta[a]["rounds"], b: 1, c: meta[c]["rounds"]}, done={a, c})
        got = {n: iteration_s(body, n, span) for n, span in ended_jobs(st, body).items()}
        shown = {j.job: j for j in batch_status(st, slurm)}
    pred = {j["name"]: j["segments"][0]["iteration_s"] for j in body["jobs"]}
    assert set(got) == {a, c}  # b has not ended
    for name in (a, c):  # ran exactly as planned: measured = predicted
        assert got[name] == pytest.approx(pred[name], rel=1e-6)
        assert shown[name].measured_iter_s == pytest.approx(pred[name], rel=1e-6)
        assert shown[name].predicted_iter_s == pytest.approx(pred[name], rel=1e-3)
        assert "iterations" not in shown[name].slow
    assert shown[b].measured_iter_s is None
    # the same plan run twice as slow: flagged
    with _running_pool(tmp_path, monkeypatch, "mi", "s2.db", plan) as (st, slurm, _, body2):
        _write_tasks(pool_dirs(st, body2["plan_id"]).report_dir, body2,
                     {a: meta[a]["rounds"]}, done={a}, stretch=2.0)
        slow = {j.job: j for j in batch_status(st, slurm)}[a]
    assert slow.measured_iter_s == pytest.approx(2 * pred[a], rel=1e-6) and SLOW < 2
    assert "iterations 2" in slow.slow, slow.slow


def test_status_shows_a_pool_job_that_ended_as_completed_while_its_pool_runs(
        tmp_path: Path, monkeypatch) -> None:
    """One Slurm job runs a whole pool: a job whose executors wrote its ``job_done`` is
    COMPLETED in `status` at that end (not RUNNING, not flagged as running long), while
    the pool's Slurm job runs on for the others; counts say so too."""
    from hetsched.app.monitor import Monitor
    from hetsched.app.pool_submit import pool_dirs
    from hetsched.app.status import batch_counts, batch_status, counts

    with _running_pool(tmp_path, monkeypatch, "pc") as (st, slurm, plan, body):
        a, b, c = (j.name for j in plan.jobs)
        meta = body["tasks"]["jobs"]
        t0 = next(float(p["created"]) for p in st.plans() if p["id"] == body["plan_id"])
        _write_tasks(pool_dirs(st, body["plan_id"]).report_dir, body,
                     {a: meta[a]["rounds"], b: 1}, done={a}, t0=t0)
        shown = {j.job: j for j in batch_status(st, slurm, now=t0 + 10_000.0)}
        Monitor(st, slurm).poll()  # what `watch` prints after a poll
        watched = batch_counts(st)
    jct = {j["name"]: j["jct_s"] for j in body["jobs"]}
    assert shown[a].state == "COMPLETED" and "pool runs on" in shown[a].reason
    assert shown[a].measured_jct_s == pytest.approx(jct[a], abs=0.1)  # ended as planned
    assert shown[a].actual_end == pytest.approx(t0 + jct[a], abs=1e-3)
    assert shown[a].slow == ""  # not "running 100x its predicted time"
    for name in (b, c):  # the pool's Slurm job runs on for them
        assert shown[name].state == "RUNNING" and shown[name].actual_end is None
    assert counts(list(shown.values()))["done"] == 1
    assert watched["done"] == 1 and watched["running"] == 2
    # once the whole pool has ended, the job keeps its own end, not the pool's
    slurm.finish(str(shown[a].slurm_id))
    with open_store(tmp_path / "s.db") as st:
        after = {j.job: j for j in batch_status(st, slurm, now=t0 + 20_000.0)}
    assert after[a].state == "COMPLETED" and after[a].reason == ""
    assert after[a].actual_end == pytest.approx(t0 + jct[a], abs=1e-3)
    assert after[a].measured_jct_s == pytest.approx(jct[a], abs=0.1)


def test_status_with_slurm_down_still_says_where_a_pool_is(tmp_path: Path, monkeypatch,
                                                            runner) -> None:
    """Slurm not answering is an error (exit 4, one line), but a pool's progress is in its
    executors' report files: `status` prints its pool lines first."""
    import types

    from hetsched.app.pool_submit import pool_dirs
    from hetsched.cli import slurm as cli_slurm
    from hetsched.cli.main import main
    from hetsched.errors import EXIT_SLURM_DOWN

    with _running_pool(tmp_path, monkeypatch, "sd") as (st, slurm, plan, body):
        a = plan.jobs[0].name
        _write_tasks(pool_dirs(st, body["plan_id"]).report_dir, body, {a: 1})
    slurm.down = True
    slurm.runner = types.SimpleNamespace(total=lambda: 0)  # type: ignore[attr-defined]
    monkeypatch.setattr(cli_slurm, "_client", lambda backend="cli": slurm)
    res = runner.invoke(main, ["status", "--state", str(tmp_path / "s.db")])
    assert res.exit_code == EXIT_SLURM_DOWN, res.output
    assert f"pool plan {body['plan_id']}" in res.stdout and f"{a}: round 2 of " in res.stdout
    assert "Slurm did not answer" in res.stderr and "Traceback" not in res.output
    js = runner.invoke(main, ["status", "--state", str(tmp_path / "s.db"), "--format", "json"])
    assert js.exit_code == EXIT_SLURM_DOWN and js.stdout == ""  # no half a JSON document


def test_status_reads_a_pools_reports_once_until_they_change(tmp_path: Path,
                                                              monkeypatch) -> None:
    """`status` asks for the active pool's reports twice (its table's measured iterations,
    its pool lines): they are read once, and again only after an executor wrote more."""
    from hetsched.app import pool_status
    from hetsched.app.pool_submit import pool_dirs
    from hetsched.app.status import batch_status

    reads: list[str] = []
    real = pool_status.read_pool_reports

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        reads.append(str(args[1]))
        return real(*args, **kw)

    monkeypatch.setattr(pool_status, "read_pool_reports", counted)
    with _running_pool(tmp_path, monkeypatch, "ro") as (st, slurm, plan, body):
        a = plan.jobs[0].name
        report_dir = pool_dirs(st, body["plan_id"]).report_dir
        _write_tasks(report_dir, body, {a: 1})
        batch_status(st, slurm)
        first = pool_status.active_pool_progress(st)
        assert reads == [body["plan_id"]]  # the second ask read nothing
        _write_tasks(report_dir, body, {a: body["tasks"]["jobs"][a]["rounds"]}, done={a})
        batch_status(st, slurm)
        again = pool_status.active_pool_progress(st)
    assert len(reads) == 2  # the files changed: read again, once
    assert first is not None and again is not None
    by = {j.job: j for j in again.jobs}
    assert by[a].done and not {j.job: j for j in first.jobs}[a].done
