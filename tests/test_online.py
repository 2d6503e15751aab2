"""The primal-dual pieces against the paper, and online replays that never peek."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetsched.app.simulate import noisy_problem, simulate_problem
from hetsched.core.problem import PlanningProblem
from hetsched.planning.space.evaluator import Evaluator, simulate
from hetsched.planning.space.policies import REGISTRY, make_policy
from hetsched.planning.space.policies.primal_dual import (
    JobMenu,
    alpha_bound,
    alpha_round,
    dual,
    frame_tau,
    gamma_param,
    lam_param,
    maxweight,
    mincost_one,
    mincost_two,
    price,
    ring_rho,
)
from tests.planner_helpers import check_plan, instances, make_cluster, make_job, make_table

# ---------------------------------------------------------------------------
# the paper's definitions on a worked example (numbers worked by hand)


def test_price_function_and_lambda_match_eq_11() -> None:
    # T=4 slots, H=2 servers, R=1 type, F=2: lambda = 2*4*2*1*2 + 1 = 33
    lam = lam_param(4, 2, 1, 2.0)
    assert lam == 33.0
    assert price(0.0, 4, lam) == pytest.approx(0.0)  # free resource costs nothing
    assert price(2.0, 4, lam) == pytest.approx(math.sqrt(33) - 1)  # half used: 4.7446
    assert price(4.0, 4, lam) == pytest.approx(32.0)  # exhausted: lambda - 1
    assert price(1.0, 0, lam) == pytest.approx(0.0)  # a type the server does not have


def test_alpha_matches_theorem_5_and_section_5_3() -> None:
    lam = 33.0
    gamma = gamma_param(lam)  # 2 log2 33 = 10.0888
    assert gamma == pytest.approx(10.08877, rel=1e-5)
    # w(J) = 4, w_min = 1: (log2 4 - 0) / (log2 10.0888 - log2 9.0888) = 2 / 0.15059 = 13.28
    assert alpha_round([1.0, 1.0, 2.0], gamma) == 14
    # Theorem 5's denominator 1 + log log lam - log(2 log lam - 1) is the same quantity
    assert alpha_bound([1.0, 1.0, 2.0], lam) == 14
    assert alpha_round([5.0], gamma) == 1  # one job: one round is enough
    assert [frame_tau(i) for i in range(5)] == [1, 1, 2, 4, 8]


def test_ring_rho_is_eq_14() -> None:
    # v = 0.5, U = 0.2, pi = 4, b = 2, Phi = 4
    assert ring_rho(0.5, 0.2, 4.0, 2.0, 4, True) == pytest.approx(1 / (0.5 + 0.15))
    assert ring_rho(0.5, 0.2, 4.0, 2.0, 4, False) == pytest.approx(1 / (0.5 + 0.15 + 3.0))
    assert ring_rho(0.5, 0.2, 4.0, 2.0, 1, False) == pytest.approx(2.0)  # one worker: no ring


def _two_nodes() -> tuple[np.ndarray, np.ndarray]:
    return np.array([0, 0]), np.array([2, 2])  # two servers of 2 type-0 GPUs


def test_mincost_picks_the_cheapest_window_and_server() -> None:
    node_type, cap = _two_nodes()
    free = np.repeat(cap[:, None], 4, axis=1)
    delta = np.zeros((2, 4))
    delta[0, :2] = 5.0  # server 0 is expensive in slots 0-1
    menu = JobMenu(0, 100.0, {0: {2: (2, 3)}})
    one = mincost_one(menu, free, delta, node_type)
    assert one is not None
    assert (one.start, one.length, one.q, one.cost) == (0, 2, 1, 0.0)
    assert one.y.tolist() == [0, 2]  # all on the free-priced server 1
    two = mincost_two(menu, free, delta, node_type)
    assert two is not None and two.q == 0 and two.length == 3
    assert two.cost == 0.0 and two.y.sum() == 2
    # a full server cannot host the one-node schedule in those slots
    free[1, :] = 0
    one = mincost_one(menu, free, delta, node_type)
    assert one is not None and one.y.tolist() == [2, 0] and one.start == 2


def test_equal_cost_ties_follow_the_papers_loop_order_or_the_earliest_end() -> None:
    node_type, cap = _two_nodes()
    free = np.repeat(cap[:, None], 4, axis=1)
    delta = np.zeros((2, 4))  # every price 0: every schedule costs 0
    dur = {0: {1: (4, 4), 2: (2, 3)}}
    # Algorithm 6 loops workers 1..D_j and replaces only if strictly cheaper: 1 worker
    loop = mincost_one(JobMenu(0, 10.0, dur), free, delta, node_type)
    assert loop is not None and (loop.phi, loop.start, loop.y.tolist()) == (1, 0, [1, 0])
    end = mincost_one(JobMenu(0, 10.0, dur, ties="end"), free, delta, node_type)
    assert end is not None and (end.phi, end.length) == (2, 2)  # the earliest end
    # impact: end + GPU-slots / GPUs of the type (4 here): 1 worker 4 + 4/4 = 5,
    # 2 workers 2 + 4/4 = 3 -> 2 workers; with 1 GPU of the type counted: 4+4 = 8
    # against 2+4 = 6 -> still 2; longer for 2 workers (3.5 slots): 3.5+7 = 10.5 > 8 -> 1
    imp = mincost_one(JobMenu(0, 10.0, dur, ties="impact", type_gpus={0: 4}), free, delta,
                      node_type)
    assert imp is not None and imp.phi == 2
    slow = {0: {1: (4, 4), 2: (4, 4)}}
    imp = mincost_one(JobMenu(0, 10.0, slow, {(0, 1, 1): 4.0, (0, 2, 1): 3.5}, "impact",
                             {0: 1}), free, delta, node_type)
    assert imp is not None and imp.phi == 1


def test_maxweight_prices_out_a_job_whose_weight_is_below_its_cost() -> None:
    node_type, cap = np.array([0, 0]), np.array([4, 4])
    lam = lam_param(1, 2, 1, 1.0)  # 2*1*2*1*1 + 1 = 5
    big = JobMenu(0, 100.0, {0: {3: (1, 1)}})
    small = JobMenu(1, 100.0, {0: {3: (1, 1)}})
    cheap = JobMenu(2, 1.0, {0: {1: (1, 1)}})
    rich = JobMenu(3, 3.0, {0: {1: (1, 1)}})
    # big and small take 3 of 4 GPUs of a server each; one more GPU-slot then
    # costs 5**(3/4) - 1 = 2.344: above cheap's weight, below rich's
    assert price(3, 4, lam) == pytest.approx(2.3437, abs=1e-4)
    res = maxweight([big, small, cheap, rich], np.repeat(cap[:, None], 1, axis=1), cap,
                    node_type, lam)
    assert [c.key for c in res.chosen] == [0, 1, 3]
    assert res.chosen[2].cost == pytest.approx(5 ** 0.75 - 1)
    # A_dual: cheap gets the second round's window, priced from zero again
    out = dual([big, small, cheap, rich], np.repeat(cap[:, None], 2, axis=1), cap, node_type,
               1, 2, lam)
    assert sorted((c.key, c.start) for c in out) == [(0, 0), (1, 0), (2, 1), (3, 0)]


def test_alpha_reported_with_a_plan_is_the_papers_for_that_batch() -> None:
    """One batch of 4 equal-weight jobs on 2 nodes x 1 GPU type (H=2, R=1).

    Equal weights stay equal after scaling, so Sec. 5.3's alpha is
    floor(log2(4) / (log2 g - log2(g - 1))) + 1 with g = 2 log2 lambda and
    lambda = 2*tau*H*R*F + 1, whatever tau and F the batch got.
    """
    table = make_table({("w", "v100"): (0.02, 0.001, 64)})
    cluster = make_cluster([("v1", "v100", 2), ("v2", "v100", 2)])
    jobs = [make_job(f"j{k}", "w", dataset_size=300 * 64, global_batch=64, max_gpus=2)
            for k in range(4)]
    plan = simulate(PlanningProblem(jobs, cluster, table), make_policy("opd", {"slot_s": 60}))
    o = plan.extra["opd"]
    first = o["frames"][0]
    assert first["jobs"] == 4
    lam = 2 * first["tau_slots"] * 2 * 1 * first["F"] + 1
    assert first["lambda"] == pytest.approx(lam, rel=1e-5)
    gamma = 2 * math.log2(lam)
    assert first["gamma"] == pytest.approx(gamma, rel=1e-5)
    want = math.floor(2.0 / (math.log2(gamma) - math.log2(gamma - 1))) + 1
    assert first["alpha"] == want == alpha_round([1.0] * 4, gamma)
    assert o["alpha"] == max(f["alpha"] for f in o["frames"])
    assert o["competitive_bound"] == 4 * o["alpha"]
    # the default is the engineering variant: Theorem 5 is not claimed for it
    assert o["variant"] == "frames=arrival,launch=frame,eager=True,ties=impact" and not o["bound_proved"]


def test_opd_default_and_the_paper_variant() -> None:
    d = make_policy("opd")
    assert (d.frames, d.eager, d.launch, d.ties, d.faithful) == (
        "arrival", True, "frame", "impact", False)
    p = make_policy("opd", {"faithful": True, "frames": "arrival", "eager": True})
    assert (p.frames, p.eager, p.launch, p.ties, p.faithful) == (
        "doubling", False, "alpha", "loop", True)
    plan = simulate(_problem(25.0), p)
    o = plan.extra["opd"]
    assert o["variant"] == "paper" and o["bound_proved"]
    assert o["launch"] == "alpha" and all(f["launch_slot"] >= f["alpha"] * f["tau_slots"]
                                          for f in o["frames"])  # Algorithm 1: from alpha*tau_i


def test_replan_plans_opd_with_the_default_variant() -> None:
    """replan (online or not) repeats the active plan's settings; --policy opd uses the default."""
    from hetsched.app.plan import how_planned
    from hetsched.planning.planner import make_plan

    p = _problem(25.0)
    s = how_planned(None, "opd")
    plan = make_plan(list(p.jobs), p.cluster, p.table, **s.make_plan_kwargs())
    assert plan.extra["opd"]["variant"] == "frames=arrival,launch=frame,eager=True,ties=impact"
    paper = make_plan(list(p.jobs), p.cluster, p.table, policy="opd", params={"faithful": True})
    again = how_planned(paper, None)  # a plan made with faithful=true is replanned the same way
    assert again.params == {"faithful": True}
    plan = make_plan(list(p.jobs), p.cluster, p.table, **again.make_plan_kwargs())
    assert plan.extra["opd"]["variant"] == "paper"


# ---------------------------------------------------------------------------
# online: never use jobs that have not arrived

ONLINE = [(n, {}) for n in sorted(REGISTRY) if n not in ("exhaustive", "has")] + [
    ("opd", {"faithful": True}), ("opd", {"frames": "doubling"}), ("opd", {"eager": False})]


def _problem(late_arrival: float | None) -> PlanningProblem:
    table = make_table({("w", "v100"): (0.02, 0.001, 64), ("w", "k80"): (0.05, 0.004, 32)})
    cluster = make_cluster([("v1", "v100", 2), ("v2", "v100", 2), ("k1", "k80", 4)])
    jobs = [make_job(f"j{k}", "w", dataset_size=200 * 64 * (k + 1), global_batch=64,
                     arrival_s=10.0 * k, weight=1.0 + k % 2, model_size_mb=50.0)
            for k in range(4)]
    if late_arrival is not None:
        jobs.append(make_job("late", "w", dataset_size=400 * 64, global_batch=64,
                             arrival_s=late_arrival, weight=3.0, model_size_mb=50.0))
    return PlanningProblem(jobs, cluster, table)


def _decisions_before(plan, t: float) -> list[tuple]:  # noqa: ANN001
    out = []
    for jp in plan.jobs:
        for s in jp.segments:
            if s.start_s < t - 1e-9:
                out.append((jp.name, round(s.start_s, 9),
                            tuple((w.node, w.gpu, w.local_batch) for w in s.workers)))
    return sorted(out)


@pytest.mark.parametrize(("policy", "params"), ONLINE)
def test_a_hidden_late_job_changes_no_earlier_decision(policy, params) -> None:
    late = 25.0
    with_late = simulate(_problem(late), make_policy(policy, params))
    without = simulate(_problem(None), make_policy(policy, params))
    before = _decisions_before(with_late, late)
    assert before, "the replay made decisions before the late arrival"
    assert before == _decisions_before(without, late)
    jp = with_late.job("late")
    assert jp.start_s >= late


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=4, max_gpus=8), st.sampled_from(ONLINE), st.floats(1.0, 400.0))
def test_no_policy_peeks_at_a_job_before_it_arrives(inst, pol, late) -> None:
    name, params = pol
    first = inst.jobs[0]
    extra = dataclasses.replace(first, name="late", arrival_s=max(j.arrival_s for j in inst.jobs)
                                + late, weight=4.0)
    hidden = PlanningProblem(inst.jobs, inst.cluster, inst.table)
    shown = PlanningProblem([*inst.jobs, extra], inst.cluster, inst.table)
    a = simulate(shown, make_policy(name, params))
    b = simulate(hidden, make_policy(name, params))
    assert _decisions_before(a, extra.arrival_s) == _decisions_before(b, extra.arrival_s)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=5, max_gpus=10), st.sampled_from(["frame", "alpha"]), st.booleans(),
       st.sampled_from(["doubling", "arrival"]), st.sampled_from([0.0, 1.0, 60.0]),
       st.sampled_from([0.0, 0.5]))
def test_opd_schedules_are_feasible_on_random_arrivals(inst, launch, eager, frames, slot,
                                                       noise) -> None:
    # slots much longer than the jobs and +-50% wrong profiles: planned windows
    # end long after (or before) the jobs do; the replay must still finish
    p = inst.problem()
    pred = noisy_problem(p, noise, seed=2) if noise else None
    plan = simulate(p, make_policy("opd", {"launch": launch, "eager": eager, "frames": frames,
                                           "slot_s": slot}), predicted=pred)
    check_plan(p, plan)  # capacity, arrivals, bounds, timings recomputed from the model
    assert all(len(jp.segments) == 1 for jp in plan.jobs)  # non-preemptive, as the paper
    o = plan.extra["opd"]
    assert o["alpha"] >= 1 and o["competitive_bound"] == 4 * o["alpha"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=5, max_gpus=10), st.sampled_from(["drf", "las"]))
def test_new_baselines_are_feasible(inst, policy) -> None:
    p = inst.problem()
    check_plan(p, simulate(p, make_policy(policy)))


def test_noise_changes_what_the_policy_sees_not_how_time_runs() -> None:
    p = _problem(25.0)
    q = noisy_problem(p, 0.2, seed=3)
    assert not np.allclose(q.c, p.c) and np.allclose(q.c / p.c, (q.a / p.a)[:, :1])
    res = simulate_problem(p, "srtf", noise=0.2, seed=3, offline=None)
    ev = Evaluator(p)
    gid = {(g.node, g.index): k for k, g in enumerate(p.cluster.gpus)}
    for i, jp in enumerate(res.online.jobs):
        for s in jp.segments:
            tm = ev.timing(i, [gid[(w.node, w.gpu)] for w in s.workers], "equal")
            assert s.iteration_s == pytest.approx(tm.iteration_s)  # the true model
    assert res.ratio_lower_bound >= 1.0 - 1e-9


def test_noise_scales_every_part_of_an_iteration_alike() -> None:
    # a piecewise step (Gavel's ResNet-18 on K80) with a modelled all-reduce, and a job
    # whose sync was calibrated at 2 and 4 GPUs: the noisy copy's iteration time is the
    # factor times the true one at every count vector, compute and sync alike
    from hetsched.core.throughput import ProfileRow, ThroughputTable

    pts = [(16, 0.2085), (32, 0.1394), (64, 0.1418), (128, 0.5535), (256, 1.1292)]
    rows = ([ProfileRow("r", "k80", b, t) for b, t in pts]
            + [ProfileRow("r", "v100", b, 0.01 + 0.0012 * b) for b in (16, 32, 64, 128, 256)]
            + [ProfileRow("w", "v100", b, t, gpus=k) for b, t, k in
               ((16, 0.026, 1), (32, 0.042, 1), (16, 0.036, 2), (32, 0.052, 2),
                (16, 0.056, 4), (32, 0.072, 4))]
            + [ProfileRow("r", "v100", 64, 0.15, colocated_with="w:32"),
               ProfileRow("w", "v100", 32, 0.07, colocated_with="r:64")])
    cluster = make_cluster([("k1", "k80", 4), ("v1", "v100", 4)])
    jobs = [make_job("r", "r", dataset_size=25600, global_batch=256, model_size_mb=50.0),
            make_job("w", "w", dataset_size=6400, global_batch=64, gpu_types=["v100"])]
    p = PlanningProblem(jobs, cluster, ThroughputTable(rows))
    assert p.curves[0] is not None and p.calibrated[1]  # both paths are exercised
    counts = np.array([[k, v] for k in range(5) for v in range(5) if k + v])
    before = [p.iter_time(i, counts) for i in range(p.S)]
    q = noisy_problem(p, 0.3, seed=5)
    f = q.c[:, -1] / p.c[:, -1]
    assert not np.allclose(f, 1.0)
    for i in range(p.S):
        ok = np.isfinite(p.iter_time(i, counts))
        assert ok.sum() >= 3
        assert np.allclose(q.iter_time(i, counts)[ok], f[i] * before[i][ok])
        assert np.array_equal(p.iter_time(i, counts)[ok], before[i][ok])  # p left as it was
    # a measured co-located pair takes each job's own factor
    assert q.pair_step_s(0, 64, 1, 32, "v100") == pytest.approx(f[0] * 0.15)
    assert q.pair_step_s(1, 32, 0, 64, "v100") == pytest.approx(f[1] * 0.07)
    assert p.pair_step_s(0, 64, 1, 32, "v100") == 0.15 and q.pair_step_s(0, 16, 1, 32, "v100") is None


@pytest.mark.slow
def test_simulate_cli_reports_ratios_and_writes_json(tmp_path) -> None:
    import yaml

    jobs = [dataclasses.asdict(j) for j in _problem(25.0).jobs]
    for j in jobs:
        for k in [k for k, v in j.items() if v is None]:
            del j[k]
    (tmp_path / "trace.yaml").write_text(yaml.safe_dump({"jobs": jobs}))
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "name": "t", "network": {"intra_node_gbps": 300, "inter_node_gbps": 10},
        "nodes": [{"names": "v[1-2]", "gpu_type": "v100", "gpus": 2},
                  {"names": "k1", "gpu_type": "k80", "gpus": 4}]}))
    (tmp_path / "p.csv").write_text(
        "workload,gpu_type,local_batch,step_time_s\n"
        "w,v100,32,0.052\nw,v100,64,0.084\nw,k80,16,0.114\nw,k80,32,0.178\n")
    r = subprocess.run(["hetsched", "simulate",
                        str(tmp_path / "trace.yaml"), "--cluster", str(tmp_path / "cluster.yaml"),
                        "--throughputs", str(tmp_path / "p.csv"), "--policy", "opd",
                        "--noise", "0.2", "--out", str(tmp_path / "r.json"),
                        "--png", str(tmp_path / "cdf.png")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "online/offline" in r.stdout and "alpha" in r.stdout
    body = json.loads((tmp_path / "r.json").read_text())
    m = body["metrics"]
    assert body["ratio_lower_bound"] == pytest.approx(m["weighted_jct_s"] / body["lower_bound_s"],
                                                      rel=1e-5)
    assert body["ratio_offline"] == pytest.approx(
        m["weighted_jct_s"] / body["offline"]["weighted_jct_s"], rel=1e-5)
    assert 0 < m["gpu_utilisation"] <= 1 and len(body["jobs"]) == 5
    assert body["opd"]["competitive_bound"] == 4 * body["opd"]["alpha"]
    for png in ("cdf.png", "cdf-gantt.png"):  # JCT CDF and the online plan's Gantt chart
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(["hetsched", "simulate",
                          str(tmp_path / "trace.yaml"), "--cluster",
                          str(tmp_path / "cluster.yaml"), "--throughputs",
                          str(tmp_path / "p.csv"), "--policy", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown policy" in bad.stderr
    # alpha beside an opd plan: a line of `plan`'s summary, and the JSON document
    plan = subprocess.run(["hetsched", "plan", str(tmp_path / "trace.yaml"), "--cluster",
                           str(tmp_path / "cluster.yaml"), "--throughputs",
                           str(tmp_path / "p.csv"), "--policy", "opd", "--param",
                           "faithful=true"], capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    line = next(ln for ln in plan.stdout.splitlines() if "opd alpha" in ln)
    assert "4*alpha" in line and "proved" in line and "not proved" not in line
    doc = subprocess.run(["hetsched", "plan", str(tmp_path / "trace.yaml"), "--cluster",
                          str(tmp_path / "cluster.yaml"), "--throughputs",
                          str(tmp_path / "p.csv"), "--policy", "opd", "--format", "json"],
                         capture_output=True, text=True, timeout=300)
    o = json.loads(doc.stdout)["opd"]
    assert o["competitive_bound"] == 4 * o["alpha"] and o["bound_proved"] is False


def test_opd_releases_the_window_of_a_job_that_ended_early() -> None:
    """A job predicted 1.9x too slow ends long before its planned window does.

    Slots of 600 s; A (1,000 s true, 1,900 s predicted) holds both GPUs of the
    only node in slots [1, 5); B arrives at 1,100 s, after A has ended, and
    fits one slot. Its batch window [3, 4) lies inside A's stale window: opd
    must see the GPUs are idle, release it, and start B at the next slot
    (1,200 s) instead of waiting for an event that never comes.
    """
    from hetsched.core.estimates import Estimates

    table = make_table({("w", "v100"): (0.0, 0.01, 64)})
    cluster = make_cluster([("n1", "v100", 2)])
    jobs = [make_job("A", "w", dataset_size=3125 * 64, global_batch=64, min_gpus=2,
                     max_gpus=2),
            make_job("B", "w", dataset_size=1875 * 64, global_batch=64, min_gpus=2,
                     max_gpus=2, arrival_s=1100.0)]
    p = PlanningProblem(jobs, cluster, table)
    pred = noisy_problem(p, 0.0)
    pred.a, pred.c = p.a.copy(), p.c.copy()
    pred.c[0] *= 1.9
    pred.estimates = Estimates.of(pred)
    plan = simulate(p, make_policy("opd", {"frames": "arrival", "eager": False, "slot_s": 600}),
                    predicted=pred)
    check_plan(p, plan)
    assert plan.job("A").end_s == pytest.approx(1000.0)
    assert plan.job("B").start_s == pytest.approx(1200.0)
