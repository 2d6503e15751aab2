"""The exact optimum of tiny instances (a pulp MILP) checks the bound and the heuristics."""

from __future__ import annotations

import pytest
from pool_helpers import exact_optimum, tiny_instance

from hetsched.planning.pool import POOL_AUTO, plan_pool
from hetsched.planning.pool.problem import PoolProblem
from hetsched.planning.pool.relaxation import alpha


@pytest.mark.parametrize("seed", range(12))
def test_bound_le_optimum_le_heuristics(seed: int) -> None:
    p = tiny_instance(seed)
    pp = PoolProblem(p, task_iterations=1)
    opt = exact_optimum(pp)
    # the pool model alone (hare space=off): its optimum bounds every pool-model plan
    plans = {pol: plan_pool(p, pol, {"space": "off"} if pol == "hare" else None,
                            task_iterations=1) for pol in POOL_AUTO}
    lb = plans["hare"].lower_bound_s
    assert lb <= opt * (1 + 1e-6) + 1e-6
    for pol, plan in plans.items():
        assert plan.weighted_jct_s >= opt * (1 - 1e-6) - 1e-6, pol
    # space=keep also plans space mode and keeps the better plan: never above either,
    # and its bound (the lower of the two models') is below both
    both = plan_pool(p, "hare", {"space": "keep"}, task_iterations=1)
    assert both.weighted_jct_s <= plans["hare"].weighted_jct_s + 1e-9
    info = both.notes.pool_vs_space
    assert both.weighted_jct_s <= info["space_weighted_jct_s"] + 1e-9
    assert both.lower_bound_s <= min(opt, info["space_weighted_jct_s"]) * (1 + 1e-6) + 1e-6
    # The paper's guarantee (Theorem 4) is on sum w_i C_i; check Hare against it loosely
    # (our relaxation is not the paper's MIQP, so this is a sanity check, not the proof).
    wa = float((pp.weight * pp.arrival).sum())
    a = alpha(pp)
    assert plans["hare"].weighted_jct_s + wa <= a * (2 + a) * (opt + wa) + 1e-6


def test_hare_is_optimal_on_most_tiny_instances() -> None:
    """Not a guarantee, a regression guard: Hare matches the optimum within 10% mostly."""
    good = 0
    for seed in range(12):
        p = tiny_instance(seed)
        opt = exact_optimum(PoolProblem(p, task_iterations=1))
        if plan_pool(p, "hare", {"space": "off"},
                     task_iterations=1).weighted_jct_s <= 1.10 * opt + 1e-6:
            good += 1
    assert good >= 9
