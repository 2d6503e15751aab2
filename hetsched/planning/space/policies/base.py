"""The policy interface and registry.

A policy answers one question, at one reset event: given the active jobs, the
iterations each has left and the GPUs free per type, how many GPUs of each type
does each job get now? The evaluator (:mod:`hetsched.planning.space.evaluator`) owns time,
placement onto nodes, batch shares, restart costs and the objective, so every
policy's plan is measured the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError
from hetsched.planning.base import BasePolicy


@dataclass
class Snapshot:
    """What a policy sees at a reset event.

    ``jobs`` are problem job indices to place, ``remaining`` their iterations
    left, ``free`` the free GPUs per type, ``current`` each job's current
    per-type counts (zeros if waiting) and ``waited`` how long it has waited.
    ``restart_cost_s`` is what the evaluator charges a running job it moves
    (None: not given); a policy that does its own selection (``ones``) prices it.
    """

    t: float
    jobs: np.ndarray
    remaining: np.ndarray
    free: np.ndarray
    current: np.ndarray
    waited: np.ndarray = field(default_factory=lambda: np.zeros(0))
    restart_cost_s: float | None = None


class Policy(BasePolicy):
    """A space-mode policy: named, documented constructor parameters and ``allocate``.

    See :mod:`hetsched.planning.base` for how a new policy plugs in.
    """

    mode: ClassVar[str] = "space"
    #: "balanced" (water-filling shares) or "equal" (what the baseline's paper does)
    shares: ClassVar[str] = "balanced"
    #: may move running jobs at reset events (restart cost applies); False = never
    preemptive: ClassVar[bool] = True
    #: worker placement: "pack" (few nodes, fastest-first) or "oblivious" (cluster order)
    placement: ClassVar[str] = "pack"

    #: auto's work model (planning/select.py): reference seconds one reset event costs,
    #: ``EVENT_S + JOB_S x active jobs`` (measured on the 2-core bench machine, quiet); a
    #: policy whose inner search varies with the event adds its own count to ``work_s``
    EVENT_S: ClassVar[float] = 2e-3
    JOB_S: ClassVar[float] = 2e-5
    #: counted work beyond the per-event model (reference seconds), added by the policy
    work_s: float = 0.0

    def __init__(self) -> None:
        """Policies without parameters take none; others override with keyword-only ones."""

    @classmethod
    def event_work(cls, problem: PlanningProblem, n_active: int) -> float:
        """Reference seconds one reset event with ``n_active`` active jobs is counted as."""
        return cls.EVENT_S + cls.JOB_S * n_active

    @classmethod
    def predict_work(cls, problem: PlanningProblem, active: list[int],
                     horizon_s: float = 0.0) -> float:
        """Predicted counted work on ``problem`` given the active jobs at each event of a
        plan already made (auto's first candidate's; ``horizon_s`` its makespan): never a
        clock, so auto's choice of candidates is the same on a quiet and on a busy machine."""
        c = cls.cost(problem)
        if c is not None and not np.isfinite(c):
            return float("inf")
        n = np.asarray(active, dtype=float)
        return float(len(n) * cls.EVENT_S + cls.JOB_S * n.sum())

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        """Return an int array (len(snap.jobs), T) of GPUs per type per job; zero rows wait."""
        raise NotImplementedError


REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a space-mode policy known by its (globally unique) name."""
    from hetsched.planning.registry import claim

    claim(cls.name, "space")
    REGISTRY[cls.name] = cls
    return cls


def make_policy(name: str, params: dict[str, Any] | None = None,
                source: str = "--policy") -> Policy:
    """Construct a registered policy, with errors that list what would be valid."""

    if name not in REGISTRY:
        raise InputError(source, f"unknown policy {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    policy: Policy = REGISTRY[name].build(params)
    return policy


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line; numbers and booleans are converted."""
    if "=" not in text:
        raise InputError("--param", f"{text!r}: expected key=value, e.g. samples=40")
    k, v = text.split("=", 1)
    val: Any = v
    if v.lower() in ("true", "false"):
        val = v.lower() == "true"
    else:
        for conv in (int, float):
            try:
                val = conv(v)
                break
            except ValueError:
                pass
    return k.strip(), val
