"""Co-located job groups (Harmony, ../shared/papers/harmony-ps-colocation.txt §IV).

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
