"""GPU memory: what a GPU holds and what a job's model state needs (one table, both modes).

Pool mode's speculative memory plan (Hare) and co-located groups (Harmony)
both bound what shares a GPU by these numbers: the cluster file's
``gpu_memory_gb`` of a node, else the type's usual memory; a job's declared
``memory_gb``, else an estimate from its model size.
"""

from __future__ import annotations

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


__all__ = ["DEFAULT_GPU_MEMORY_GB", "FALLBACK_GPU_MEMORY_GB", "MODEL_STATE_FACTOR",
           "FALLBACK_MODEL_GB", "gpu_memory_gb", "type_memory_gb", "job_state_gb"]
