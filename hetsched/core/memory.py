"""GPU memory: what a GPU holds and what a job's model state needs (one table, both modes).

Pool mode's speculative memory plan (Hare) and co-located groups (Harmony)
both bound what shares a GPU by these numbers: the cluster file's
``gpu_memory_gb`` of a node, else the type's usual memory; a job's declared
``memory_gb``, else an estimate from its model size.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetsched.core.spec import Cluster, Job

#: GPU memory (GB) per type when the cluster file gives no ``gpu_memory_gb``.
#: K80 is the per-die figure (a K80 board is two 12 GB GPUs as Slurm sees them).
DEFAULT_GPU_MEMORY_GB = {
    "k80": 12.0, "m60": 8.0, "p100": 16.0, "p40": 24.0, "v100": 16.0, "t4": 16.0,
    "a10": 24.0, "a100": 40.0, "a40": 48.0, "l4": 24.0, "l40s": 48.0, "h100": 80.0,
    "h200": 141.0,
}
#: fallback for GPU types not in the table above
FALLBACK_GPU_MEMORY_GB = 16.0
#: model state per MB of gradients when a job gives no ``memory_gb``: fp32
#: weights + gradients + two Adam moments = 4x the gradient bytes
MODEL_STATE_FACTOR = 4.0
#: resident footprint when neither memory_gb nor model_size_mb is known
FALLBACK_MODEL_GB = 1.0


def gpu_memory_gb(cluster: Cluster) -> np.ndarray:
    """Memory (GB) of every GPU of ``cluster.gpus``, in that order."""
    node_mem = {n.name: n.gpu_memory_gb for n in cluster.nodes}
    return np.array([node_mem.get(g.node) or DEFAULT_GPU_MEMORY_GB.get(g.gpu_type,
                                                                        FALLBACK_GPU_MEMORY_GB)
                     for g in cluster.gpus], dtype=float)


def type_memory_gb(cluster: Cluster, types: list[str]) -> np.ndarray:
    """The smallest GPU memory (GB) of each type in ``types`` (a bound that holds on any GPU)."""
    mem = gpu_memory_gb(cluster)
    out = np.full(len(types), np.inf)
    index = {t: k for k, t in enumerate(types)}
    for g, m in zip(cluster.gpus, mem, strict=True):
        k = index.get(g.gpu_type)
        if k is not None:
            out[k] = min(out[k], m)
    return np.where(np.isfinite(out), out, FALLBACK_GPU_MEMORY_GB)


def job_state_gb(job: Job) -> float:
    """GB of model state a job keeps resident: declared, else estimated from its model size."""
    if job.memory_gb is not None:
        return float(job.memory_gb)
    if job.model_size_mb > 0:
        return MODEL_STATE_FACTOR * job.model_size_mb / 1000.0
    return FALLBACK_MODEL_GB


#: without a measured memory cap, the largest profiled local batch is taken to
#: fill this share of the memory a GPU has beside the model state
UNMEASURED_FILL = 0.4


def fill_batch(max_batch: int, memory_cap: int | None) -> float:
    """The local batch at which a job alone fills a GPU's memory (activations + state).

    A measured cap (a GPU probe's out-of-memory search, or a profile's
    ``max_local_batch`` column) is that batch. Without one (CPU probes,
    Gavel's table) the largest profiled batch says only that it ran, not
    that it filled the GPU: its activations are taken to fill
    ``UNMEASURED_FILL`` of the memory beside the model state. Two jobs at
    their largest profiled batches then share a GPU when their model states
    take at most a third of it, as a GPU with room for both would allow;
    at the old assumption (the largest batch fills the GPU) no pair ever did.
    """
    if memory_cap is not None and memory_cap > 0:
        return float(memory_cap)
    return max(1.0, float(max_batch)) / UNMEASURED_FILL




def no_group_reason(p: object, max_pairs: int = 2000) -> str:
    """Why a co-locating policy formed no group: memory, or no predicted gain.

    ``p`` is a :class:`hetsched.core.problem.PlanningProblem`. A pair of jobs
    fits when, on some GPU type both may use and at some GPU count both
    allow, their local batches are within the caps and their model state
    and activations fit one GPU together (:func:`fill_batch`). At most
    ``max_pairs`` pairs are looked at.
    """
    import math

    from hetsched.core.colocation import fits_memory

    prob: Any = p
    mem = type_memory_gb(prob.cluster, prob.types)
    pairs = fit = 0
    for i in range(prob.S):
        for j in range(i + 1, prob.S):
            if pairs >= max_pairs:
                break
            pairs += 1
            ids = (i, j)
            if any(_pair_fits(prob, ids, t, mem[t], fits_memory, math.ceil)
                   for t in range(len(prob.types)) if prob.allowed[i, t] and prob.allowed[j, t]):
                fit += 1
    if pairs == 0:
        return "fewer than two jobs"
    if fit == 0:
        return (f"no pair of jobs fits one GPU's memory ({pairs} pairs checked: model state "
                "plus activations at the local batches their GPU counts give)")
    return (f"{fit} of {pairs} pairs fit one GPU's memory, but sharing was not predicted to "
            "lower weighted JCT")


def _pair_fits(p: Any, ids: tuple[int, int], t: int, gpu_gb: float, fits: Any,
               ceil: Any) -> bool:
    lo = max(int(p.lo[i]) for i in ids)
    hi = min(min(int(p.hi[i]), int(p.B[i])) for i in ids)
    for k in range(lo, min(hi, int(p.n_type[t])) + 1):
        b = [float(ceil(p.B[i] / k)) for i in ids]
        if any(bi > p.cap[i, t] for i, bi in zip(ids, b, strict=True)):
            continue
        if fits([job_state_gb(p.jobs[i]) for i in ids], b,
                [float(p.mem_cap[i, t]) for i in ids], gpu_gb):
            return True
    return False


__all__ = ["DEFAULT_GPU_MEMORY_GB", "FALLBACK_GPU_MEMORY_GB", "MODEL_STATE_FACTOR",
           "FALLBACK_MODEL_GB", "UNMEASURED_FILL", "gpu_memory_gb", "type_memory_gb",
           "job_state_gb", "fill_batch", "no_group_reason"]
