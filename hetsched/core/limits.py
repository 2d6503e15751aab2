"""Bounds on every number and every input size hetsched accepts.

One table, so a user (and docs/formats.md) can see what is accepted and the
error can name the bound it hit. The bounds are far above any real batch
(ImageNet-21k has 1.4e7 samples, a large partition a few thousand GPUs) and
low enough that nothing downstream overflows, allocates gigabytes, or turns
a number into ``Infinity`` in a plan.

:func:`check_number` is the one check every loader and :class:`~hetsched.core.spec.Job`
use; it returns the error text (``None`` when the value is fine) so each caller
names its own file and field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bound:
    """``minimum <= value <= maximum`` (``minimum < value`` when ``strict``)."""

    minimum: float
    maximum: float
    strict: bool = False
    integer: bool = False


#: job fields (jobs file, :class:`~hetsched.core.spec.Job`)
JOB = {
    "dataset_size": Bound(1, 10**12, integer=True),
    "epochs": Bound(0, 1e6, strict=True),
    "global_batch": Bound(1, 10**7, integer=True),
    "weight": Bound(0, 1e6, strict=True),
    "arrival_s": Bound(0, 1e9),
    "model_size_mb": Bound(0, 1e7),
    "min_gpus": Bound(1, 100_000, integer=True),
    "max_gpus": Bound(1, 100_000, integer=True),
    "requested_gpus": Bound(1, 100_000, integer=True),
    "memory_gb": Bound(0, 1e5, strict=True),
}

#: cluster fields (cluster file)
CLUSTER = {
    "gpus": Bound(1, 1024, integer=True),  # per node
    "gpu_memory_gb": Bound(0, 1e5, strict=True),
    "intra_node_gbps": Bound(0, 1e7, strict=True),
    "inter_node_gbps": Bound(0, 1e7, strict=True),
}

#: profile CSV columns
PROFILE = {
    "local_batch": Bound(0, 10**7, strict=True, integer=True),
    "step_time_s": Bound(0, 1e6, strict=True),
    "sync_time_s": Bound(0, 1e6, strict=True),
    "max_local_batch": Bound(0, 10**7, strict=True, integer=True),
    "gpus": Bound(0, 10**5, strict=True, integer=True),
    "optimizer_s": Bound(0, 1e6),  # 0: no share (under a floor the step time did not grow)
}

#: a pool plan's ``tasks`` section (``tasks.jobs[J]`` and the runs of ``tasks.gpus[G]``)
POOL = {
    "tasks_per_round": Bound(1, 100_000, integer=True),
    "rounds": Bound(1, 10**7, integer=True),
    "iterations_per_task": Bound(1, 10**7, integer=True),
    "last_round_iterations": Bound(1, 10**7, integer=True),
    "local_batch": Bound(1, 10**7, integer=True),
    "model_memory_gb": Bound(0, 1e5),
    "memory_gb": Bound(0, 1e5),
    "gpu": Bound(0, 1023, integer=True),
    "tasks": Bound(0, 10**7, integer=True),
    "repeat": Bound(1, 10**7, integer=True),
    "round_step": Bound(0, 10**7, integer=True),
    "period_s": Bound(0, 1e9),
    "time_s": Bound(0, 1e12),
}
#: tasks of a pool plan in all, once its runs are expanded (what an executor holds)
MAX_POOL_TASKS = 5_000_000

# -- sizes ------------------------------------------------------------------
MAX_JOBS = 100_000
MAX_NODES = 100_000
MAX_TOTAL_GPUS = 100_000
MAX_PROFILE_ROWS = 1_000_000
#: a 10,000-job file is about 1.5 MB; the YAML scanner reads ~1 MB/s in the worst case
MAX_YAML_BYTES = 8 * 1024 * 1024
MAX_CSV_BYTES = 64 * 1024 * 1024
#: one CSV field (Python's csv module default)
MAX_CSV_FIELD = 128 * 1024
#: a 10,000-job plan is about 20 MB
MAX_PLAN_BYTES = 256 * 1024 * 1024
MAX_YAML_DEPTH = 64
#: digits of an integer literal; 20 digits already exceed every bound above
MAX_INT_DIGITS = 20
MAX_STRING = 4096
#: the pool executor's wire: one JSON header of a request or a reply
MAX_EXEC_HEADER = 64 * 1024
MAX_COMMAND_ARGS = 1024


def check_number(value: object, bound: Bound) -> str | None:
    """The error text for ``value`` against ``bound``, or None when it is acceptable."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number, got {value!r}"[:200]
    if isinstance(value, int):
        if abs(value) >= 10**MAX_INT_DIGITS:
            return (f"a {len(str(abs(value)))}-digit number is out of range; the limit is "
                    f"{bound.maximum:g}")
    elif not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    if bound.integer and float(value) != int(value):
        return f"expected a whole number, got {value!r}"
    if bound.strict and not value > bound.minimum:
        return f"must be > {bound.minimum:g}, got {value!r}"
    if not bound.strict and not value >= bound.minimum:
        return f"must be >= {bound.minimum:g}, got {value!r}"
    if value > bound.maximum:
        return f"must be <= {bound.maximum:g} (hetsched's limit), got {value!r}"
    return None


def check_size(what: str, count: int, limit: int) -> str | None:
    """The error text when ``count`` items of ``what`` exceed ``limit``."""
    if count > limit:
        return f"{count} {what}; the limit is {limit}"
    return None
