"""The ones policy: feasible on random instances (checked by the evaluator), reproducible,
and end to end through `hetsched plan`, the plan file and the hetjob script."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planner_helpers import Instance, instances

from hetsched.core.spec import Elastic
from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies.base import make_policy

ROOT = Path(__file__).resolve().parents[1]


@st.composite
def elastic_instances(draw: st.DrawFn) -> Instance:
    inst = draw(instances(max_jobs=5, max_gpus=10))
    jobs = []
    for j in inst.jobs:
        if draw(st.booleans()):
            lo = draw(st.integers(1, j.global_batch))
            hi = draw(st.integers(j.global_batch, 8 * j.global_batch))
            noise = draw(st.one_of(st.none(), st.floats(1.0, 1e4)))
            j = dataclasses.replace(j, elastic=Elastic(lo, hi, "linear", noise),
                                    epochs=draw(st.sampled_from([1.0, 3.0, 7.5])))
        jobs.append(j)
    return Instance(jobs, inst.cluster, inst.profiles, inst.sync)


def _check_feasible(inst: Instance, plan) -> None:  # type: ignore[no-untyped-def]
    """What the evaluator asserts while planning, checked again on the finished plan."""
    p = inst.problem()
    caps = {(w, g): cap for (w, g), (_, _, cap) in inst.profiles.items()}
    busy: list[tuple[float, float, tuple[str, int]]] = []
    for jp in plan.jobs:
        job = jp.spec
        assert jp.segments, jp.name
        for s in jp.segments:
            B = sum(w.local_batch for w in s.workers)
            lo, hi = (job.elastic.min_batch, job.elastic.max_batch) if job.elastic \
                else (job.global_batch, job.global_batch)
            assert lo <= B <= hi, (jp.name, B, lo, hi)
            if job.elastic:
                assert s.global_batch == B
            assert all(1 <= w.local_batch <= caps[(job.workload, w.gpu_type)]
                       for w in s.workers)
            assert job.min_gpus <= len(s.workers) <= (job.max_gpus or 10 ** 9)
            busy += [(s.start_s, s.end_s, (w.node, w.gpu)) for w in s.workers]
    busy.sort()
    for gpu in {b[2] for b in busy}:
        spans = [b for b in busy if b[2] == gpu]
        for (_, e0, _), (s1, _, _) in zip(spans, spans[1:], strict=False):
            assert s1 >= e0 - 1e-6, (gpu, e0, s1)  # no GPU held by two jobs at once
    done = {jp.name: sum(s.iterations * (s.global_batch or jp.spec.global_batch)
                         for s in jp.segments) for jp in plan.jobs}
    for i, j in enumerate(p.jobs):  # every job processed at least its samples' worth
        assert done[j.name] >= 0.999 * p.iters[i] * j.global_batch * (
            0.0 if j.elastic and j.elastic.noise_scale else 1.0), j.name


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elastic_instances(), st.integers(0, 3))
def test_never_infeasible_and_reproducible(inst: Instance, seed: int) -> None:
    plans = []
    for _ in range(2):
        pol = make_policy("ones", {"seed": seed, "tick_s": 50.0, "population": 6})
        plans.append(simulate(inst.problem(), pol, restart_cost_s=10.0))
    _check_feasible(inst, plans[0])
    a, b = (json.dumps({k: v for k, v in pl.to_dict().items() if k != "planning_time_s"},
                       sort_keys=True) for pl in plans)
    assert a == b  # the same seed gives the same plan


def test_batches_change_and_elastic_jobs_beat_their_fixed_batch() -> None:
    """Two elastic jobs alone on 8 GPUs: ones grows them (bigger batches, more GPUs)."""
    from planner_helpers import make_cluster, make_job, make_table

    table = make_table({("w", "v100"): (0.05, 0.001, 64)})
    cl = make_cluster([("n0", "v100", 4), ("n1", "v100", 4)])
    el = [make_job(f"j{k}", "w", dataset_size=6400, epochs=20, global_batch=32,
                   elastic=Elastic(16, 512, "linear")) for k in range(2)]
    from hetsched.core.problem import PlanningProblem

    plan = simulate(PlanningProblem(el, cl, table), make_policy("ones", {"seed": 1}))
    batches = {s.global_batch for jp in plan.jobs for s in jp.segments}
    assert max(batches) > 32 and len(batches) > 1  # scaled up after epochs
    fixed = [dataclasses.replace(j, elastic=None) for j in el]
    base = simulate(PlanningProblem(fixed, cl, table), make_policy("jps"))
    assert plan.avg_jct_s < base.avg_jct_s
    assert np.isfinite(plan.makespan_s)


@pytest.mark.slow
def test_cli_plan_marks_segment_batches_and_predictions(tmp_path: Path) -> None:
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n"
        "  - {name: r18, workload: resnet-18, dataset_size: 20000, epochs: 6,"
        " global_batch: 128, elastic: {min_batch: 64, max_batch: 1024, lr_scaling: sqrt}}\n"
        "  - {name: tf, workload: transformer, dataset_size: 20000, target_loss: 0.5,"
        " global_batch: 128, arrival_s: 5}\n")
    exe = shutil.which("hetsched")
    assert exe
    out = tmp_path / "plan.json"
    r = subprocess.run([exe, "plan", str(tmp_path / "jobs.yaml"), "--cluster",
                        str(ROOT / "examples" / "cluster.yaml"), "--throughputs",
                        str(ROOT / "examples" / "gavel_throughputs.csv"), "--policy", "ones",
                        "--param", "seed=3", "--out", str(out), "--format", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    body = json.loads(out.read_text())
    jobs = {j["name"]: j for j in body["jobs"]}
    segs = jobs["r18"]["segments"]
    assert all(s["global_batch"] == sum(w["local_batch"] for w in s["workers"]) for s in segs)
    assert jobs["tf"]["spec"]["epochs_predicted"] is True
    assert jobs["tf"]["spec"]["target_loss"] == 0.5
    from hetsched.io.plan_json import load_plan
    from hetsched.slurm.templates import render_hetjob

    plan = load_plan(out)
    jp = plan.job("r18")
    k = len(jp.segments) - 1
    assert jp.segments[k].global_batch == segs[k]["global_batch"]
    script = render_hetjob(plan.plan_id or "x", jp, k, plan_path=out, log_dir=tmp_path).text
    assert "--layout" in script  # the segment's batch reaches the ranks through its layout
    from hetsched.io.layout import job_layout

    lay = job_layout(plan, plan.plan_id or "x", out, "r18", k)
    assert sum(w["local_batch"] for w in lay.workers()) == segs[k]["global_batch"]


def test_restart_cost_is_priced_a_short_job_takes_gpus_only_when_a_move_is_cheap() -> None:
    """A short job arrives while a long one holds both GPUs (after its first epoch).

    Free restarts: ones's refresh gives the new job a GPU taken from the running one
    (the paper's preferential allocation). A prohibitive restart cost: SRUF prices
    the move as lost progress, so the running job keeps its GPUs and the new one waits.
    """
    from planner_helpers import make_cluster, make_job, make_table, moved_running_job

    from hetsched.core.problem import PlanningProblem

    table = make_table({("w", "v100"): (0.01, 0.001, 64)})
    cl = make_cluster([("n0", "v100", 2)])
    jobs = [make_job("long", "w", dataset_size=64000, epochs=4, global_batch=64),
            make_job("short", "w", dataset_size=640, epochs=1, global_batch=64,
                     arrival_s=50.0)]
    p = PlanningProblem(jobs, cl, table)
    cheap = simulate(p, make_policy("ones"), restart_cost_s=0.0)
    assert moved_running_job(cheap)
    assert cheap.job("short").segments[0].start_s == 50.0
    dear = simulate(p, make_policy("ones"), restart_cost_s=1e7)
    assert not moved_running_job(dear)
    assert len(dear.job("long").segments) == 1
    assert dear.job("short").segments[0].start_s == dear.job("long").end_s


def test_idle_gpus_are_filled_only_with_scale_ups_that_finish_sooner() -> None:
    """A fixed-batch job whose all-reduce costs more than its compute, alone on 8 GPUs.

    The paper's fill gives idle GPUs to some job whatever the gain, and the job
    ends later on its many GPUs; with ``grow_faster`` (the default) it keeps one.
    """
    from planner_helpers import make_cluster, make_job, make_table

    from hetsched.core.problem import PlanningProblem

    table = make_table({("w", "v100"): (0.001, 0.0001, 64)})
    cl = make_cluster([("n0", "v100", 4), ("n1", "v100", 4)], intra=1.0, inter=0.1)
    job = make_job("big", "w", dataset_size=64_000, epochs=3, global_batch=64,
                   model_size_mb=2.0)
    p = PlanningProblem([job], cl, table)
    fast = simulate(p, make_policy("ones", {"seed": 0}))
    paper = simulate(p, make_policy("ones", {"seed": 0, "grow_faster": False}))
    assert {len(s.workers) for s in fast.job("big").segments} == {1}
    assert max(len(s.workers) for s in paper.job("big").segments) > 1
    assert fast.avg_jct_s < paper.avg_jct_s


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elastic_instances(), st.integers(0, 2))
def test_ones_is_never_worse_than_the_best_fixed_batch_plan(inst: Instance, seed: int) -> None:
    """`ones` starts from the best fixed-batch plan (auto over the fixed-batch policies)
    and keeps it unless its own search finds better: never above any fixed-batch policy."""
    from hetsched.errors import PlanningError
    from hetsched.planning import registry
    from hetsched.planning.planner import plan_problem

    p = inst.problem()
    reg = registry.policies("space")
    fixed = {}
    for n in registry.auto_candidates("space"):
        try:
            fixed[n] = simulate(p, reg[n](), restart_cost_s=60.0).weighted_jct_s
        except PlanningError:  # exhaustive above its size limit
            pass
    plan = plan_problem(p, "ones", {"seed": seed, "population": 6}, restart_cost_s=60.0,
                        budget_s=1e9, workers=1)
    info = plan.notes.fixed_start
    assert plan.weighted_jct_s <= min(fixed.values()) * (1 + 1e-9)
    assert plan.weighted_jct_s == min(info["own_weighted_jct_s"], info["fixed_weighted_jct_s"])
    assert plan.policy == "ones"
    pure = plan_problem(p, "ones", {"seed": seed, "population": 6, "keep_fixed": False},
                        restart_cost_s=60.0, workers=1)
    assert pure.notes.fixed_start is None  # the paper's search alone, by parameter
    assert pure.weighted_jct_s == info["own_weighted_jct_s"]
