"""The pool-mode problem: Hare_Sched (Hare, HPDC'22, section 5.1) built from a PlanningProblem.

In pool mode the partition's GPUs are one shared pool. Job ``i`` is a chain of
``R_i`` training rounds; every round has ``P_i`` tasks (the job's parallelism:
``requested_gpus``, else chosen by :mod:`.parallelism`, at least ``min_gpus``);
a task trains the per-task slice
``b_i = ceil(B_i / P_i)`` of the round's global batch. All tasks of round r
(and their synchronisation) must end before any task of round r+1 starts
(constraint 7); tasks are non-preemptive (8); nothing starts before the
job's arrival (4).

Task granularity. Real jobs run 10^4-10^6 iterations, so a task stands for
``N_i`` iterations of its slice (``--task-iterations``): its compute time on
GPU type t is ``N_i * (a_it + c_it * b_i)`` (the affine model), where the
executor trains one slice a pass; it trains ``m`` steps' slices a pass where
the job's chunk on that type holds them (:mod:`.fusion`), so the task takes
``N_i / m`` passes of ``m b_i`` samples: ``t_it`` is that per step. A task
accumulates its iterations' gradients and exchanges them once, as the executor
does (one push, one optimizer step per round, one pull: docs/executor.md), so
its synchronisation time is one exchange, ``s_task``: the comm model's time of
one synchronisation of ``P_i`` workers (calibrated from multi-GPU measurements
where the profile has them, else the ring all-reduce of ``model_size_mb`` over
the inter-node bandwidth, or the profiled sync time when no model size is
given), whatever the task's iterations. ``s_it = s_task / N_i`` is that
exchange spread over a full round's iterations, for the models that count per
iteration (the gang baselines, the relaxation). The last round takes the
remaining iterations. ``N_i = 1`` is exactly the paper's model. The default
picks, per job, the smallest N for which a task lasts at least
``switch_s / 1%`` (0.5 s for Hare's ~5 ms task switch) on the job's fastest
GPU type, raised if needed so that no job has more than ``max_rounds`` rounds
(keeps planning time and plan size bounded).

What the executor costs: a task's iteration is the executor's, forward and
backward without the optimizer step (the job's coordinator steps the optimizer
once per round): the profiled step less the optimizer's share where the
profile measured it (``optimizer_s``, a constant per (workload, GPU type):
:func:`pool_iteration_times`). A task's time also carries the executor's
measured per-task overhead (``task_overhead_s``: the GPU's idle time before
the task's compute, from the executors' reports folded into the profile
history; 0 until measured), paid once per task and spread over its ``N_i``
iterations. The coordinator's optimizer step is in that measured overhead
(the next round's tasks wait for it); until an overhead is measured it is
added to the round's synchronisation instead, once per round.

Synchronisation does not occupy the GPU: it overlaps the next task on that
GPU (Algorithm 1, line 16); it only delays the job's next round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetsched.core.memory import (
    DEFAULT_GPU_MEMORY_GB,
    FALLBACK_GPU_MEMORY_GB,
    FALLBACK_MODEL_GB,
    MODEL_STATE_FACTOR,
    gpu_memory_gb,
    job_state_gb,
)
from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError, PlanningError
from hetsched.planning.pool.fusion import (  # MIN_ITERATION_SHARE: re-exported
    MIN_ITERATION_SHARE,
    chunk_sizes,
    fused_compute,
    pass_times,
    pool_iteration_times,
)
from hetsched.planning.pool.parallelism import sync_s

#: Hare's measured task switch is <= 6 ms (paper Table 3); we plan for 5 ms.
DEFAULT_SWITCH_S = 0.005
#: a switch may cost at most this share of a task (1%)
SWITCH_SHARE = 0.01
#: the default task size never makes a job longer than this many rounds
DEFAULT_MAX_ROUNDS = 200
#: at most this many passes of (task size, fused step) before the task size holds
FUSE_ROUNDS = 8
#: refuse instances that would expand to more tasks than this (memory, time)
MAX_TASKS = 2_000_000

#: GPU memory per type and the model-state estimate live in core.memory (one table
#: for pool mode and Harmony's groups), the pool iteration's floor in .fusion;
#: re-exported here for existing callers
__all_memory__ = (DEFAULT_GPU_MEMORY_GB, FALLBACK_GPU_MEMORY_GB, FALLBACK_MODEL_GB,
                  MODEL_STATE_FACTOR, MIN_ITERATION_SHARE)


@dataclass
class PoolProblem:
    """Hare_Sched instance: per job rounds x tasks, per job x GPU type task times.

    Built from a :class:`PlanningProblem` (which validated the inputs). All
    arrays are indexed by job ``i`` (order of ``base.jobs``) and GPU type
    ``t`` (order of ``base.types``); ``gpu_type`` maps each GPU of
    ``base.cluster.gpus`` to its type.
    """

    base: PlanningProblem
    task_iterations: int | None = None
    max_rounds: int = DEFAULT_MAX_ROUNDS
    switch_s: float = DEFAULT_SWITCH_S
    #: choose P for jobs without requested_gpus; False: P = min_gpus (the old rule)
    choose_parallelism: bool = True
    #: tasks train several steps' slices a pass (:mod:`.fusion`); False: one slice a pass
    fuse: bool = True
    P: np.ndarray = field(init=False)  # (S,) tasks per round
    #: job name -> why its P stayed below what the pool could give it
    parallelism_notes: dict[str, str] = field(init=False)
    slice_b: np.ndarray = field(init=False)  # (S,) local batch of one task
    N: np.ndarray = field(init=False)  # (S,) iterations per (full) round
    R: np.ndarray = field(init=False)  # (S,) rounds
    last: np.ndarray = field(init=False)  # (S,) iterations of the last round
    total_iters: np.ndarray = field(init=False)  # (S,) iterations of the job
    t_it: np.ndarray = field(init=False)  # (S, T) compute s/iteration of one task; inf = not allowed
    #: (S, T) most samples one executor pass trains (:mod:`.fusion`); 0: a slice a pass
    chunk: np.ndarray = field(init=False)
    #: (S, T) the executor's measured overhead per task (added to t_it as overhead / N)
    task_overhead_s: np.ndarray = field(init=False)
    #: (S, T) the optimizer step's share of a profiled step (0 where not profiled)
    optimizer_s: np.ndarray = field(init=False)
    round_optimizer_s: np.ndarray = field(init=False)
    #: (S, T) one task's synchronisation: one exchange of P workers (plus the round's
    #: optimizer step where no executor overhead was measured), whatever its iterations
    s_task: np.ndarray = field(init=False)
    s_it: np.ndarray = field(init=False)  # (S, T) s_task spread over a full round: / N
    ok: np.ndarray = field(init=False)  # (S, T) task may run on type t
    gpu_type: np.ndarray = field(init=False)  # (K,) type index of each GPU
    mem_gb: np.ndarray = field(init=False)  # (S,) resident model state
    gpu_mem_gb: np.ndarray = field(init=False)  # (K,) memory of each GPU

    def __post_init__(self) -> None:
        p = self.base
        S, T = p.S, p.T
        if self.task_iterations is not None and self.task_iterations < 1:
            raise InputError("--task-iterations", f"must be >= 1, got {self.task_iterations}")
        self.P = np.zeros(S, dtype=int)
        self.slice_b = np.zeros(S, dtype=int)
        self.ok = np.zeros((S, T), dtype=bool)
        floor = np.zeros(S, dtype=int)
        for i, job in enumerate(p.jobs):
            P = max(int(job.requested), int(p.lo[i]))
            capmax = int(p.cap[i][p.allowed[i]].max())
            # more tasks when one slice would not fit in any allowed GPU's memory cap
            P = max(P, math.ceil(int(p.B[i]) / capmax))
            floor[i] = min(P, int(p.B[i]))  # every task trains at least one sample
        self.parallelism_notes = {}
        self.optimizer_s = np.array([[fit.optimizer_s if (fit := p.table.get(j.workload, t))
                                      else 0.0 for t in p.types] for j in p.jobs]).reshape(S, T)
        self.chunk = chunk_sizes(p, self.optimizer_s, p.allowed) if self.fuse \
            else np.zeros((S, T), dtype=np.int64)
        fixed = np.array([j.requested_gpus is not None for j in p.jobs], dtype=bool)
        if self.choose_parallelism and not fixed.all():
            from hetsched.planning.pool.parallelism import choose_parallelism

            floor, self.parallelism_notes = choose_parallelism(
                p, floor, fixed, self._task_iterations,
                (self.chunk, self.optimizer_s) if self.fuse else None)
        for i, job in enumerate(p.jobs):
            P = int(floor[i])
            b = math.ceil(int(p.B[i]) / P)
            self.P[i], self.slice_b[i] = P, b
            self.ok[i] = p.allowed[i] & (p.cap[i] >= b)
            if not self.ok[i].any():  # unreachable given the P rule above; keep the guard
                raise InputError(p.jobs_source, f"a task slice of {b} samples fits no GPU type",
                                 f"job {job.name!r}")
        bcol = self.slice_b[:, None].astype(float)
        # the space planner's step model, piecewise where the line is poor
        steps = np.vstack([p.step_times(i, np.repeat(bcol[i], T)) for i in range(S)]) if S \
            else p.a + p.c * bcol
        self.t_it = np.where(self.ok, pool_iteration_times(steps, self.optimizer_s), np.inf)
        self.chunk = np.where(self.ok, self.chunk, 0)
        single_node = sum(1 for n in p.cluster.nodes if n.usable) == 1
        self.s_task = np.zeros((S, T))
        for i in range(S):
            for t in range(T):
                self.s_task[i, t] = sync_s(p, i, [t], int(self.P[i]), single_node) \
                    if self.ok[i, t] else np.inf
        self.total_iters = np.maximum(1, np.ceil(p.iters - 1e-9)).astype(np.int64)
        unfused = self.t_it
        self.N = np.zeros(S, dtype=np.int64)
        for _ in range(FUSE_ROUNDS if self.fuse else 1):
            # N from the (fused) step, the step fused at that N, until N holds: a larger N
            # fuses more steps a pass, so the step only falls and N only grows
            fastest = np.where(self.ok, self.t_it, np.inf).min(axis=1)
            n = np.array([self._task_iterations(i, float(fastest[i])) for i in range(S)],
                         dtype=np.int64)
            if (n == self.N).all():
                break
            self.N = n
            if self.fuse:
                self.t_it = self._fused_t_it(unfused)
        self._executor_costs()
        self.R = -(-self.total_iters // self.N)
        self.last = self.total_iters - (self.R - 1) * self.N
        n_tasks = int((self.R * self.P).sum())
        if n_tasks > MAX_TASKS:
            raise PlanningError(
                f"pool mode: {n_tasks:,} tasks exceed the limit of {MAX_TASKS:,}; "
                "raise --task-iterations (or leave it unset for the automatic size)")
        tindex = {t: k for k, t in enumerate(p.types)}
        gpus = p.cluster.gpus
        self.gpu_type = np.array([tindex[g.gpu_type] for g in gpus], dtype=int)
        self.gpu_mem_gb = gpu_memory_gb(p.cluster)
        self.mem_gb = np.array([job_state_gb(j) for j in p.jobs], dtype=float)

    def _fused_t_it(self, unfused: np.ndarray) -> np.ndarray:
        """(S, T) a full round's task compute per step, its steps in fused passes
        (:mod:`.fusion`); never above ``unfused``, the step a slice at a time."""
        p = self.base
        out = unfused.copy()
        typ = np.arange(p.T)
        for i in range(p.S):
            n = int(self.N[i])
            tc = fused_compute(pass_times(p, i, self.optimizer_s[i]), typ, typ,
                               np.full(p.T, int(self.slice_b[i])), np.full(p.T, n),
                               self.chunk[i]) / n
            out[i] = np.where(self.ok[i], np.minimum(tc, unfused[i]), np.inf)
        return out

    def _task_iterations(self, i: int, step_s: Any) -> Any:
        """Iterations of job i's task whose iteration takes ``step_s`` on its fastest type:
        ``--task-iterations``, else the fewest that make a task last ``switch_s / 1%``,
        raised to keep at most ``max_rounds`` rounds; never above the job's iterations.
        The rule for N; choose_parallelism asks it before the task's size is known (it
        sets how far a worker set's sync spreads), for many step times at once: a float
        for a float, an array for an array."""
        total = max(1, math.ceil(float(self.base.iters[i]) - 1e-9))
        steps = np.asarray(step_s, dtype=float)
        if self.task_iterations is not None:
            n = np.full(steps.shape, float(min(self.task_iterations, total)))
        else:
            n = np.ceil(self.switch_s / SWITCH_SHARE / np.maximum(steps, 1e-300))
            n = np.minimum(np.maximum(n, max(math.ceil(total / self.max_rounds), 1)), total)
        return float(n) if n.ndim == 0 else n

    def _executor_costs(self) -> None:
        """Task and round times get what the executor costs beside the step."""
        p = self.base
        S, T = p.S, p.T
        # what the executor costs: its measured per-task overhead (the device's idle time
        # before a task's compute, from the executors' reports via the profile history),
        # paid once per task, spread over the task's iterations
        self.task_overhead_s = np.array([[self._task_overhead(job.workload, t)
                                          for t in p.types] for job in p.jobs]).reshape(S, T)
        self.t_it = np.where(self.ok, self.t_it + self.task_overhead_s / self.N[:, None],
                             np.inf)
        # the coordinator's optimizer step, once per round: inside the measured overhead;
        # without one, on the round's synchronisation path
        known = getattr(p.table, "task_overhead_s", None) or {}
        unmeasured = np.array([[(j.workload, t) not in known for t in p.types]
                               for j in p.jobs], dtype=bool).reshape(S, T)
        #: (S, T) the coordinator's optimizer step once per round where no overhead was
        #: measured (uneven rounds add it per round: planning/pool/uneven.py)
        self.round_optimizer_s = np.where(self.ok & unmeasured, self.optimizer_s, 0.0)
        self.s_task = np.where(self.ok & unmeasured, self.s_task + self.optimizer_s,
                               self.s_task)
        self.s_it = self.s_task / self.N[:, None]

    def _task_overhead(self, workload: str, gpu_type: str) -> float:
        """Measured per-task executor overhead of (workload, type); 0 when never measured."""
        known = getattr(self.base.table, "task_overhead_s", None) or {}
        return float(known.get((workload, gpu_type), 0.0))

    # ------------------------------------------------------------------
    @property
    def S(self) -> int:
        return self.base.S

    @property
    def T(self) -> int:
        return self.base.T

    @property
    def K(self) -> int:
        return len(self.gpu_type)

    @property
    def weight(self) -> np.ndarray:
        return self.base.weight

    @property
    def arrival(self) -> np.ndarray:
        return self.base.arrival

    @property
    def n_type_gpus(self) -> np.ndarray:
        """(T,) GPUs of each type in the pool."""
        return np.bincount(self.gpu_type, minlength=self.T)

    @property
    def n_tasks(self) -> int:
        return int((self.R * self.P).sum())

    def round_iters(self, i: int, r: int) -> int:
        """Iterations in round r of job i (the last round may be shorter)."""
        return int(self.last[i]) if r == int(self.R[i]) - 1 else int(self.N[i])

    def round_iters_array(self, job: np.ndarray, rnd: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`round_iters`."""
        return np.where(rnd == self.R[job] - 1, self.last[job], self.N[job])

    def allowed_gpus(self, i: int) -> int:
        """How many GPUs of the pool job i's tasks may use."""
        return int(self.ok[i][self.gpu_type].sum())

    def best_rate(self, i: int) -> float:
        """Task-iterations/s of job i on its min(P, allowed GPUs) fastest GPUs (an upper bound)."""
        t = np.sort(self.t_it[i][self.gpu_type][self.ok[i][self.gpu_type]])
        return float((1.0 / t[: int(self.P[i])]).sum())

    def critical_path(self, i: int) -> float:
        """No schedule finishes job i faster than this after it starts (see hare.py)."""
        s_min = float(self.s_it[i][self.ok[i]].min())
        return float(self.total_iters[i]) * (float(self.P[i]) / self.best_rate(i) + s_min)
