"""Fused steps: a pool task trains several of its round's step slices in one pass.

A pool task trains its slice of each of its round's ``n`` global batches and
sums the gradients for the round's one optimizer step (the coordinator's).
Nothing in that sum asks for one forward and backward pass per slice: ``m``
slices in one pass of ``m * b`` samples give the same gradient (up to layers
that normalise over the batch) and pay a pass's fixed cost once instead of
``m`` times. For a job whose per-GPU slice is small next to what a GPU holds
(a small global batch over several GPUs), that fixed cost is most of a pass.

The planner picks, per job and GPU type, the *chunk*: the largest batch up to
the profile's cap over which the pool iteration's time per sample never rises
(the affine line with a positive intercept: the cap; a piecewise curve: up to
its first rising piece). A task of ``n`` steps at slice ``b`` then runs passes
of ``m = fused_steps(chunk, b, n)`` steps (``core.pool_tasks``; the executor
uses the same rule), and since the time per sample does not rise up to the
chunk, a fused task is never slower than the same task a slice at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetsched.core.problem import PlanningProblem

#: a pool iteration is never planned below this share of its profiled step (an
#: optimizer share measured at other batches may exceed the fitted step at a small one)
MIN_ITERATION_SHARE = 0.05
#: a job's chunk is searched at every batch up to this, then on a geometric grid
DENSE = 256
GRID = 256
#: a rise in time per sample smaller than this share is noise, not a rise
RISE = 1e-9


def pool_iteration_times(steps: np.ndarray, optimizer_s: np.ndarray) -> np.ndarray:
    """A pool task's iteration from the profiled step: the step less the optimizer's
    share (the coordinator steps the optimizer, once per round), at least
    :data:`MIN_ITERATION_SHARE` of the step."""
    return np.maximum(steps - optimizer_s, MIN_ITERATION_SHARE * steps)


def pass_times(p: PlanningProblem, i: int, optimizer_s: np.ndarray
               ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """Job i's pass seconds as :func:`fused_compute` asks for them: ``(job, typ, batch)``
    rows (``job`` unused: always i) to the pool iteration at ``batch`` on type ``typ``
    (``optimizer_s``: the job's row)."""
    def one(_job: np.ndarray, typ: np.ndarray, batch: np.ndarray) -> np.ndarray:
        grid = np.repeat(batch.astype(float)[:, None], p.T, axis=1)  # each row's batch
        steps = p.step_times(i, grid)[np.arange(len(batch)), typ]  # on its own type
        return pool_iteration_times(steps, optimizer_s[typ])
    return one


def chunk_sizes(p: PlanningProblem, optimizer_s: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(S, T) each job's chunk per GPU type (0 where it may not run); jobs of one model
    and optimizer share are searched once."""
    out = np.zeros((p.S, p.T), dtype=np.int64)
    memo: dict[tuple, np.ndarray] = {}
    for i in range(p.S):
        key = (p.model_key(i), optimizer_s[i].tobytes(), ok[i].tobytes())
        if key not in memo:
            memo[key] = _chunk_row(p, i, optimizer_s[i], ok[i])
        out[i] = memo[key]
    return out


def _chunk_row(p: PlanningProblem, i: int, opt: np.ndarray, ok: np.ndarray) -> np.ndarray:
    row = np.zeros(p.T, dtype=np.int64)
    cap = p.cap[i].astype(np.int64)
    if not ok.any():
        return row
    top = int(cap[ok].max())
    parts = [np.arange(1, min(top, DENSE) + 1, dtype=float),
             np.round(np.geomspace(1, max(top, 1), GRID))]
    for cv in p.curves[i] or ():
        if cv is not None:  # the curve's knots: time per sample is monotone between them
            parts.append(np.asarray(cv[0], dtype=float))
    grid = np.unique(np.concatenate(parts))
    grid = grid[(grid >= 1) & (grid <= top)]
    it = pool_iteration_times(p.step_times(i, np.repeat(grid[:, None], p.T, axis=1)),
                              opt[None, :])
    per = it / grid[:, None]
    for t in np.nonzero(ok)[0].tolist():
        n = int(np.searchsorted(grid, cap[t], side="right"))
        rising = np.nonzero(per[1:n, t] > per[:n - 1, t] * (1 + RISE))[0]
        row[t] = int(grid[int(rising[0]) if len(rising) else n - 1])
    return row


def fused_compute(iteration: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                  job: np.ndarray, typ: np.ndarray, batch: np.ndarray, iters: np.ndarray,
                  chunk: np.ndarray) -> np.ndarray:
    """Compute seconds of tasks (job, GPU type, slice, steps) run in fused passes:
    ``iteration(job, typ, batch)`` is one pass's seconds at ``batch`` samples; ``chunk``
    each task's chunk (0: one slice a pass). The vector form of
    ``core.pool_tasks.fused_steps``."""
    b = np.maximum(batch.astype(np.int64), 1)
    n = np.maximum(iters.astype(np.int64), 1)
    m = np.where(chunk > 0, np.clip(chunk // b, 1, n), 1)
    full, rem = n // m, n % m
    part = np.nonzero(rem > 0)[0]
    if not len(part):
        return full * iteration(job, typ, m * b)
    # the full passes and the partial ones in one call (one pass over distinct batches)
    both = iteration(np.concatenate([job, job[part]]), np.concatenate([typ, typ[part]]),
                     np.concatenate([m * b, rem[part] * b[part]]))
    out = full * both[:len(b)]
    out[part] += both[len(b):]
    return out


__all__ = ["MIN_ITERATION_SHARE", "pool_iteration_times", "pass_times", "chunk_sizes",
           "fused_compute"]
