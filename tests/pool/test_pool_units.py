"""Unit tests of pool mode: task size, memory plan, compact runs, CLI integration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from hetsched.cli.main import main
from hetsched.core.problem import PlanningProblem
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, load_jobs
from hetsched.planning.pool.compact import compress_rows, count_rows, expand_runs
from hetsched.planning.pool.memory import plan_gpu_memory
from hetsched.planning.pool.problem import DEFAULT_SWITCH_S, SWITCH_SHARE, PoolProblem

EX = Path(__file__).resolve().parents[2] / "examples"
ARGS = [str(EX / "jobs.yaml"), "--cluster", str(EX / "cluster.yaml"),
        "--throughputs", str(EX / "gavel_throughputs.csv")]


def example_problem() -> PlanningProblem:
    return PlanningProblem(load_jobs(EX / "jobs.yaml"), load_cluster(EX / "cluster.yaml"),
                           load_throughputs(EX / "gavel_throughputs.csv"))


def test_default_task_size_makes_a_switch_cost_under_one_percent() -> None:
    pp = PoolProblem(example_problem())
    for i in range(pp.S):
        fastest = float(pp.t_it[i][pp.ok[i]].min())
        full_task = float(pp.N[i]) * fastest
        assert DEFAULT_SWITCH_S <= SWITCH_SHARE * full_task + 1e-12
        assert pp.R[i] <= 200  # the round cap keeps long jobs compact
        assert (pp.R[i] - 1) * pp.N[i] + pp.last[i] == pp.total_iters[i]


def test_explicit_task_iterations_and_last_round() -> None:
    pp = PoolProblem(example_problem(), task_iterations=7)
    assert (pp.N == np.minimum(7, pp.total_iters)).all()
    assert ((pp.last >= 1) & (pp.last <= pp.N)).all()


def test_memory_plan_next_task_first_then_most_recent() -> None:
    mem = [4.0, 4.0, 4.0, 10.0]
    # A B A with 16 GB: A stays resident across B, so the second A starts warm
    mp = plan_gpu_memory([0, 1, 0], mem, 16.0)
    assert mp.warm == [False, False, True]
    assert mp.keep[0]  # room for B (next) and A: keep A
    # D needs 10 of 12 GB: after A, room for D is reserved, A cannot stay
    mp = plan_gpu_memory([0, 3, 0], mem, 12.0)
    assert mp.keep == [False, False, True]  # the last task keeps its model (nothing next)
    assert mp.warm == [False, False, False]
    # A B C A with 12 GB: after C the next (A) is resident and kept first
    mp = plan_gpu_memory([0, 1, 2, 0], mem, 12.0)
    assert mp.warm[3]
    assert mp.loads == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.floats(1.0, 20.0))
def test_memory_plan_never_exceeds_capacity(seq: list[int], cap: float) -> None:
    mem = [3.0, 5.0, 2.0, 7.0]
    mp = plan_gpu_memory(seq, mem, cap)
    resident: set[int] = set()
    for idx, j in enumerate(seq):
        assert mp.warm[idx] == (j in resident)
        resident.add(j)
        resident -= set(mp.evict_others[idx])
        if not mp.keep[idx]:
            resident.discard(j)
        nxt = seq[idx + 1] if idx + 1 < len(seq) else None
        need = sum(mem[r] for r in resident | ({nxt} if nxt is not None else set()))
        assert need <= cap + 1e-9 or (nxt is not None and mem[nxt] > cap)


def test_compact_runs_round_trip() -> None:
    # two jobs alternating on one GPU with a fixed period, then a tail
    rows = []
    t = 0.0
    for r in range(50):
        rows.append(("a", r, 0, t, t + 1.0, t + 1.2))
        rows.append(("b", r, 1, t + 1.0, t + 1.5, t + 1.5))
        t += 1.5
    rows.append(("c", 0, 0, t, t + 3.0, t + 3.0))
    job = [r[0] for r in rows]
    runs = compress_rows(job, np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
                         np.array([r[3] for r in rows]), np.array([r[4] for r in rows]),
                         np.array([r[5] for r in rows]), [True] * len(rows),
                         [[] for _ in rows])
    assert count_rows(runs) == len(rows)
    assert sum(len(r.rows) for r in runs) == 3  # one 2-row pattern x 50 + the tail
    back = expand_runs(runs)
    for (j, r, k, s, e, se), b in zip(rows, back, strict=True):
        assert (j, r, k) == (b.job, b.round, b.task)
        assert abs(s - b.start_s) < 1e-5 and abs(e - b.end_s) < 1e-5
        assert abs(se - b.sync_end_s) < 1e-5


def test_cli_pool_json_has_foundation_keys_and_tasks() -> None:
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--policy", "hare",
                                    "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    for k in ("version", "policy", "objective", "lower_bound", "jobs", "tasks"):
        assert k in d
    assert d["mode"] == "pool"
    assert d["jobs"][0]["segments"][0]["workers"]
    g = d["tasks"]["gpus"][0]
    assert d["tasks"]["columns"][:6] == ["job", "round", "task", "start_s", "end_s",
                                        "sync_end_s"]
    assert g["runs"] and "repeat" in g["runs"][0]
    assert d["lower_bound"]["weighted_jct_s"] <= d["objective"]["weighted_jct_s"] + 1e-6


def test_cli_space_mode_has_no_tasks_section() -> None:
    res = CliRunner().invoke(main, ["plan", *ARGS, "--policy", "fifo", "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert "tasks" not in d and d["mode"] == "space"


@pytest.mark.slow
def test_cli_pool_table_and_errors(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--policy", "auto",
                                    "--gantt", str(tmp_path / "g.png")])
    assert res.exit_code == 0, res.output
    assert "idle" in res.output and "warm starts" in res.output
    assert "one optimizer step per round" in res.output  # what accumulation does to a step
    # the bound line names the bound reported; the pool relaxation (equal-slice plans
    # only) is said apart, with its value, never as where the bound comes from
    assert "bounds on compute alone" in res.output
    assert "each job alone" in res.output and "pooled speed" in res.output
    assert "bounds equal-slice plans only" in res.output
    assert "lower bound from" not in res.output
    assert (tmp_path / "g.png").stat().st_size > 0
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--task-iterations", "1"])
    assert res.exit_code == 0 and "one optimizer step per round" not in res.output
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--policy", "has"])
    assert res.exit_code == 2 and "unknown pool-mode policy" in res.output
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--task-iterations", "0"])
    assert res.exit_code == 2
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--policy", "hare",
                                    "--param", "pick=sideways"])
    assert res.exit_code == 2 and "pick" in res.output


@pytest.mark.parametrize("pick", ["finish", "available"])
def test_hare_params(pick: str) -> None:
    from hetsched.planning.pool import plan_pool

    plan = plan_pool(example_problem(), "hare", {"pick": pick, "order": "relaxation"})
    assert plan.params["pick"] == pick and plan.params["order"] == "relaxation"


def test_tasks_section_is_typed_once_and_written_back_as_read() -> None:
    """io.pool_tasks.parse_pool_tasks gives attributes (no positional rows after it) and
    PoolTasks.to_dict writes back exactly what it read: absent optional keys stay absent,
    unknown keys are kept."""
    from hetsched.io.pool_tasks import parse_pool_tasks

    section = {
        "jobs": {"a": {"tasks_per_round": 2, "rounds": 3, "iterations_per_task": 4,
                       "last_round_iterations": 1, "local_batch": 8}},
        "gpus": [{"node": "n1", "gpu": 0, "gpu_type": "v100", "tasks": 6, "runs": [
            {"repeat": 3, "period_s": 2.5, "round_step": 1,
             "tasks": [["a", 0, 0, 0.0, 1.0, 1.5, "keep", []],
                       ["a", 0, 1, 1.0, 2.0, 2.5, "evict", ["b"]]]}]}],
        "note": {"kept": True},
    }
    t = parse_pool_tasks(section, "p.json", {"a", "b"})
    assert t.format is None and t.memory is None and t.extra == {"note": {"kept": True}}
    assert t.jobs["a"].iterations == 2 * 4 + 1
    g = t.gpus[0]
    assert g.id == "n1-g0" and g.memory_gb is None
    rows = g.rows()
    assert len(rows) == g.tasks == count_rows(list(g.runs))
    last = rows[-1]
    assert (last.job, last.round, last.task, last.keep, last.evict) == ("a", 2, 1, False, ("b",))
    assert last.start_s == pytest.approx(1.0 + 2 * 2.5)
    assert t.to_dict() == section


def test_cli_pool_table_shows_rounds_not_simultaneous_workers(tmp_path: Path) -> None:
    """The pool table lists the GPUs a job's tasks ran on ("GPUs used") and its rounds'
    shape (most tasks x largest local batch) from the plan's tasks section; the lower
    bound line reads as one sentence."""
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", *ARGS, "--mode", "pool", "--policy", "hare",
                                    "--no-gantt", "--out", str(out)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert "GPUs used (node:count)" in res.output and "max tasks x batch" in res.output
    assert "local batches" not in res.output
    for j in d["jobs"]:
        t = d["tasks"]["jobs"][j["name"]]
        row = next(x for x in res.output.splitlines() if f" {j['name']} " in x)
        assert f" {t['tasks_per_round']} x {t['local_batch']} " in row, row
    line = next(x for x in res.output.splitlines() if "lower bound" in x)
    assert line.rstrip().endswith(("the pooled speed)", "on pool rates)")), line
    assert "plans bound" not in line and "bound bound" not in line
