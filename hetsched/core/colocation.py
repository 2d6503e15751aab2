"""Co-located job groups (Harmony, Lee et al., §IV).

A group's jobs share the same GPUs at the same time. Each job's iteration is a
COMP part (the GPU) and a COMM part (the network, its all-reduce); the group
interleaves them so one job computes while another communicates. The group's
iteration (every member advances one iteration) takes Harmony's eq. (1).
"""

from __future__ import annotations

from collections.abc import Sequence


def group_iteration_s(compute_s: Sequence[float], comm_s: Sequence[float]) -> float:
    """Harmony eq. (1): ``max(sum comp, sum comm, max_j (comp_j + comm_j))``.

    One COMP at a time on the GPUs, one COMM at a time on the link, and no
    job faster than it is alone. ``compute_s[j]`` and ``comm_s[j]`` are job
    j's times on the group's GPUs (eq. (2): COMP shrinks as the group's GPU
    count grows; the caller computes them for that count).
    """
    if len(compute_s) != len(comm_s):
        raise ValueError("compute_s and comm_s need one entry per job")
    if not compute_s:
        return 0.0
    return max(sum(compute_s), sum(comm_s),
               max(c + m for c, m in zip(compute_s, comm_s, strict=True)))


def utilisation(compute_s: Sequence[float], comm_s: Sequence[float]) -> tuple[float, float]:
    """Harmony eq. (3): the group's (GPU, network) busy fractions over one group iteration."""
    t = group_iteration_s(compute_s, comm_s)
    if t <= 0:
        return (0.0, 0.0)
    return (sum(compute_s) / t, sum(comm_s) / t)


def cluster_utilisation(gpus: Sequence[float], util: Sequence[tuple[float, float]],
                        total_gpus: float | None = None) -> tuple[float, float]:
    """Harmony eq. (4): the GPU-weighted mean of the groups' utilisation vectors.

    ``total_gpus`` (default: the groups' GPUs) is the denominator; passing the
    cluster's GPU count counts idle GPUs as unused (how the planner compares
    groupings that leave GPUs idle).
    """
    m = float(sum(gpus)) if total_gpus is None else float(total_gpus)
    if m <= 0:
        return (0.0, 0.0)
    return (sum(g * u[0] for g, u in zip(gpus, util, strict=True)) / m,
            sum(g * u[1] for g, u in zip(gpus, util, strict=True)) / m)


def serial_iteration_s(compute_s: Sequence[float], comm_s: Sequence[float]) -> float:
    """Time slicing without coordination (Gandiva's): the group runs its jobs one after another."""
    return float(sum(compute_s) + sum(comm_s))


def member_iteration_s(compute_s: Sequence[float], comm_s: Sequence[float], *,
                       coordinated: bool = True,
                       measured: Sequence[float] | None = None) -> list[float]:
    """Each member's seconds per own iteration in a group.

    ``measured``: per-member step times measured while sharing (Gavel's
    co-located pairs) win over any model. Otherwise every member advances one
    iteration per group iteration: eq. (1) with subtask coordination
    (Harmony), the serial sum without (naive co-location, time slicing).
    A group of one is the job alone: ``compute + comm``.
    """
    if measured is not None:
        return [float(x) for x in measured]
    t = group_iteration_s(compute_s, comm_s) if coordinated or len(compute_s) == 1 \
        else serial_iteration_s(compute_s, comm_s)
    return [t] * len(compute_s)


def job_memory_gb(state_gb: float, local_batch: float, max_batch: float, gpu_gb: float) -> float:
    """GB a job uses on one GPU: its model state plus activations for its local batch.

    The profiled memory cap ``max_batch`` (largest local batch that fits the
    GPU alone) calibrates the activations: at the cap the job fills the GPU,
    so each sample takes ``(gpu_gb - state_gb) / max_batch``.
    """
    per_sample = max(0.0, gpu_gb - state_gb) / max(1.0, max_batch)
    return state_gb + per_sample * local_batch


def fits_memory(state_gb: Sequence[float], local_batch: Sequence[float],
                max_batch: Sequence[float], gpu_gb: float) -> bool:
    """Do these jobs, each with its local batch on this GPU, fit in its memory together?"""
    used = sum(job_memory_gb(s, b, m, gpu_gb)
               for s, b, m in zip(state_gb, local_batch, max_batch, strict=True))
    return used <= gpu_gb * (1 + 1e-9)


def simulate_subtasks(compute_s: Sequence[float], comm_s: Sequence[float], *,
                      coordinated: bool = True, iterations: int = 60) -> list[float]:
    """Brute force: an event simulation of the group's interleaved COMP and COMM subtasks.

    Each job alternates COMP (the GPUs) and COMM (the network). Coordinated
    (Harmony §IV-A): one subtask per resource at a time; the GPU serves the
    jobs' COMPs in a fixed round-robin order (every job one iteration per
    group iteration, what eq. (1) counts; plain first-come-first-served
    lets a job without communication lap the others), the network first
    come first served. Uncoordinated: each resource is shared equally by the subtasks
    on it (processor sharing). Returns each job's mean seconds per
    iteration over the last half of ``iterations`` group iterations (the
    steady state). For tests and the benchmark; the planner uses the closed forms.
    """
    n = len(compute_s)
    need = [[float(c), float(m)] for c, m in zip(compute_s, comm_s, strict=True)]
    phase = [0] * n           # 0 = COMP, 1 = COMM
    left = [need[j][0] for j in range(n)]
    done = [0] * n
    stamps: list[list[float]] = [[] for _ in range(n)]
    queues: list[list[int]] = [list(range(n)), []]
    turn = 0  # coordinated: whose COMP the GPU serves next (round-robin)
    t = 0.0
    while min(done) < iterations:
        # which jobs progress, and at what rate, on each resource
        rate = [0.0] * n
        for r in (0, 1):
            q = [j for j in queues[r]]
            if not q:
                continue
            if coordinated and r == 0:
                if turn in q:
                    rate[turn] = 1.0
            elif coordinated:
                rate[q[0]] = 1.0
            else:
                for j in q:
                    rate[j] = 1.0 / len(q)
        for j in range(n):  # zero-length subtasks finish at once
            if left[j] <= 0:
                rate[j] = max(rate[j], 1.0)
        dt = min((left[j] / rate[j] for j in range(n) if rate[j] > 0), default=0.0)
        t += dt
        for j in range(n):
            if rate[j] > 0:
                left[j] -= dt * rate[j]
        for j in range(n):
            if rate[j] > 0 and left[j] <= 1e-12:
                queues[phase[j]].remove(j)
                if phase[j] == 0:
                    turn = (j + 1) % n
                if phase[j] == 1:
                    done[j] += 1
                    stamps[j].append(t)
                phase[j] = 1 - phase[j]
                left[j] = need[j][phase[j]]
                queues[phase[j]].append(j)
    half = iterations // 2
    return [(s[iterations - 1] - s[half - 1]) / (iterations - half) for s in stamps]
