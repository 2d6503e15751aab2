"""hetsched: heterogeneity-aware batch planning for deep-learning training on Slurm.

The Python API (docs/api.md) is importable from here, loaded on first use so
that ``import hetsched.runtime`` inside a job step stays light::

    import hetsched
    plan = hetsched.plan(hetsched.load_jobs("jobs.yaml"),
                         hetsched.load_cluster("cluster.yaml"),
                         hetsched.load_profiles("profiles.csv"))
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {"Batch", "Cluster", "Job", "JobHandle", "Plan", "ProfileRow", "ThroughputTable",
        "load_cluster",
        "load_jobs", "load_plan", "load_profiles", "plan", "save_plan", "submit"}
_ERRORS = {"HetschedError", "InputError", "PlanningError"}

__all__ = sorted(_API | _ERRORS | {"__version__"})


def __getattr__(name: str) -> Any:  # PEP 562: lazy public API
    if name in _API:
        return getattr(importlib.import_module("hetsched.api"), name)
    if name in _ERRORS:
        return getattr(importlib.import_module("hetsched.errors"), name)
    raise AttributeError(f"module 'hetsched' has no attribute {name!r}")
