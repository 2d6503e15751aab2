"""The exhaustive policy's DP grid: kept between events, the same plans as rebuilt.

The grid of (state, allocation) pairs is built once per distinct free-GPU
vector and kept (most recently used, bounded in pairs); the DP's minimum per
state is a segmented reduction over the pairs, which must come grouped by
state in state order, in both enumerations (the P x P mask and the
per-state loop above 4,096 states).
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings

from hetsched.planning.space.evaluator import simulate
from hetsched.planning.space.policies import exhaustive
from tests.planner_helpers import instances


def _grids_agree(n: np.ndarray) -> None:
    states, s_idx, x_idx, d_idx, starts = exhaustive._grid(n)
    dims = n + 1
    assert (np.diff(s_idx) >= 0).all() and len(starts) == len(states)
    assert (x_idx[starts] == 0).all()  # each state's pairs start with "nothing"
    assert (states[x_idx] <= states[s_idx]).all()
    assert (states[d_idx] == states[s_idx] - states[x_idx]).all()
    # as many pairs as the closed form: prod over types of (n+1)(n+2)/2
    assert len(s_idx) == int(np.prod((n + 1) * (n + 2) // 2))
    s2, x2 = exhaustive._pairs(states, dims)
    assert (s2 == s_idx).all() and (x2 == x_idx).all()


def test_both_pair_enumerations_give_the_same_grouped_pairs() -> None:
    for n in ([2, 3], [1, 0, 2], [3, 3, 3], [4, 2, 1, 2]):
        _grids_agree(np.array(n))


def test_a_grid_above_the_mask_size_is_grouped_by_state() -> None:
    n = np.array([8, 8, 8, 0])  # 729 states under the mask; with a fourth type 6,561 > 4,096
    _grids_agree(n)
    states, s_idx, *_ = exhaustive._grid(np.array([8, 8, 8, 8]))
    assert len(states) > 4096 and (np.diff(s_idx) >= 0).all()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(max_jobs=5, max_gpus=10))
def test_plans_do_not_depend_on_how_many_grids_are_kept(inst) -> None:
    p = inst.problem()
    kept = simulate(p, exhaustive.Exhaustive(), restart_cost_s=0.0)
    fresh = exhaustive.Exhaustive()
    fresh.GRID_CACHE_PAIRS = 0  # keeps only the last grid: rebuilt whenever the free GPUs change
    built = simulate(p, fresh, restart_cost_s=0.0)
    assert [j.to_dict() for j in kept.jobs] == [j.to_dict() for j in built.jobs]
    assert kept.weighted_jct_s == built.weighted_jct_s
