"""The `simulate` use case: replay a job trace online and judge a policy against an oracle.

Jobs arrive in arrival order; the policy is asked at every reset event
(arrival, completion, or a time the policy asks to be woken at) about the
jobs that have arrived and are not done: receding horizon, as ``replan`` does
on a real cluster. Time runs through the same evaluator and model as ``plan``
(:func:`hetsched.planning.space.evaluator.simulate`); with ``noise`` the
policy (and the evaluator's keep-or-move choice) sees predicted step times,
each job's off by a factor drawn uniformly from [1-x, 1+x], while the
replay runs the true ones.

The offline reference is what ``hetsched plan`` computes for the whole trace
with the true profiles (``offline``, default ``auto``: the best of its
candidates); the lower bound is :func:`hetsched.planning.bounds.lower_bound`.
online / lower bound is an upper bound on the empirical competitive ratio
(the optimum lies between the bound and the offline plan).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched.config import DEFAULT_RESTART_COST_S
from hetsched.core.plan import Plan
from hetsched.core.problem import PlanningProblem
from hetsched.core.report import BaseReporter
from hetsched.core.spec import Cluster, Job
from hetsched.core.throughput import ThroughputTable
from hetsched.errors import InputError
from hetsched.planning.planner import plan_problem
from hetsched.planning.space.evaluator import simulate as evaluate
from hetsched.planning.space.policies.base import make_policy


def noisy_problem(problem: PlanningProblem, noise: float, seed: int = 0) -> PlanningProblem:
    """A copy whose iteration times are off by a per-job factor 1 +- noise: compute (the
    affine line or the piecewise curve) and synchronisation (measured, modelled from the
    model's size, or calibrated at several scales) alike."""
    if noise < 0 or noise >= 1:
        raise InputError("--noise", f"{noise!r}: expected a fraction in [0, 1), e.g. 0.2")
    f = 1.0 + np.random.default_rng(seed).uniform(-noise, noise, problem.S)
    return problem.scaled(step=f, sync=f)


def metrics(plan: Plan, problem: PlanningProblem) -> dict[str, float]:
    """Weighted/average JCT, makespan, queueing delay, GPU utilisation, restarts per job."""
    busy = sum((s.end_s - s.start_s) * len(s.workers) for j in plan.jobs for s in j.segments)
    span = plan.makespan_s
    queue = [j.start_s - j.arrival_s for j in plan.jobs]
    restarts = [sum(1 for s in j.segments if s.restart_s > 0) for j in plan.jobs]
    return {
        "weighted_jct_s": plan.weighted_jct_s,
        "avg_jct_s": plan.avg_jct_s,
        "makespan_s": span,
        "avg_queue_s": float(np.mean(queue)),
        "gpu_utilisation": busy / (problem.K * span) if span > 0 else 0.0,
        "restarts_per_job": float(np.mean(restarts)),
    }


@dataclass
class SimResult:
    policy: str
    noise: float
    online: Plan
    metrics: dict[str, float]
    lower_bound_s: float
    offline: Plan | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio_offline(self) -> float | None:
        if self.offline is None:
            return None
        return self.online.weighted_jct_s / self.offline.weighted_jct_s

    @property
    def ratio_lower_bound(self) -> float:
        lb = self.lower_bound_s
        return self.online.weighted_jct_s / lb if lb > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy, "noise": self.noise,
            "metrics": {k: round(v, 6) for k, v in self.metrics.items()},
            "lower_bound_s": round(self.lower_bound_s, 6),
            "ratio_lower_bound": round(self.ratio_lower_bound, 6),
        }
        if self.offline is not None:
            out["offline"] = {"policy": self.offline.policy,
                              "weighted_jct_s": round(self.offline.weighted_jct_s, 6)}
            out["ratio_offline"] = round(self.ratio_offline or 0.0, 6)
        out.update(self.extra)
        out["jobs"] = self.online.rows()
        return out


def simulate_problem(problem: PlanningProblem, policy: str, params: dict[str, Any] | None = None,
                     *, noise: float = 0.0, seed: int = 0, restart_cost_s: float = DEFAULT_RESTART_COST_S,
                     offline: str | None = "auto",
                     reporter: BaseReporter | None = None) -> SimResult:
    """Replay ``problem`` online under ``policy``; compare with ``offline`` (None: skip).

    ``reporter`` sees the replay as candidate ``POLICY (online)`` (an event per
    arrival, completion or wake-up), then the offline plan's candidates.
    """
    if policy == "auto":
        raise InputError("--policy", "simulate runs one policy online; pick one of "
                         "`hetsched policies` (auto is the offline best-of)")
    pol = make_policy(policy, params)
    pred = noisy_problem(problem, noise, seed) if noise > 0 else None
    rep = reporter or BaseReporter()
    t0 = time.perf_counter()
    rep.candidate_started(pol.name)
    online = evaluate(problem, pol, restart_cost_s=restart_cost_s, predicted=pred, reporter=rep)
    replay_s = time.perf_counter() - t0
    rep.candidate_done(pol.name, online.weighted_jct_s, replay_s)
    online.extra.setdefault("simulation", {"noise": noise, "seed": seed,
                                           "replay_s": round(replay_s, 3)})
    off = None
    if offline:
        rep.note(f"offline reference: {offline}, all profiles true")
        off = plan_problem(problem, offline, restart_cost_s=restart_cost_s, reporter=rep)
    res = SimResult(policy, noise, online, metrics(online, problem), online.lower_bound_s, off)
    if "opd" in online.extra:
        res.extra["opd"] = {k: v for k, v in online.extra["opd"].items() if k != "frames"}
    return res


def simulate_trace(jobs: list[Job], cluster: Cluster, table: ThroughputTable, policy: str,
                   params: dict[str, Any] | None = None, *, jobs_source: str = "jobs",
                   **kw: Any) -> SimResult:
    """Load the problem and :func:`simulate_problem` it."""
    return simulate_problem(PlanningProblem(jobs, cluster, table, jobs_source=jobs_source),
                            policy, params, **kw)
