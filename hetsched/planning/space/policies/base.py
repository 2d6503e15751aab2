"""The policy interface and registry.

A policy answers one question, at one reset event: given the active jobs, the
iterations each has left and the GPUs free per type, how many GPUs of each type
does each job get now? The evaluator (:mod:`hetsched.planning.space.evaluator`) owns time,
placement onto nodes, batch shares, restart costs and the objective, so every
policy's plan is measured the same way.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError


@dataclass
class Snapshot:
    """What a policy sees at a reset event.

    ``jobs`` are problem job indices to place, ``remaining`` their iterations
    left, ``free`` the free GPUs per type, ``current`` each job's current
    per-type counts (zeros if waiting) and ``waited`` how long it has waited.
    """

    t: float
    jobs: np.ndarray
    remaining: np.ndarray
    free: np.ndarray
    current: np.ndarray
    waited: np.ndarray = field(default_factory=lambda: np.zeros(0))


class Policy:
    """Base class: named, documented constructor parameters and ``allocate``."""

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    #: "balanced" (water-filling shares) or "equal" (what the baseline's paper does)
    shares: ClassVar[str] = "balanced"
    #: may move running jobs at reset events (restart cost applies); False = never
    preemptive: ClassVar[bool] = True
    #: worker placement: "pack" (few nodes, fastest-first) or "oblivious" (cluster order)
    placement: ClassVar[str] = "pack"
    #: one call at t=0 is everything that runs (exhaustive-style heavy policies)
    param_docs: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        """Policies without parameters take none; others override with keyword-only ones."""

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        """Return an int array (len(snap.jobs), T) of GPUs per type per job; zero rows wait."""
        raise NotImplementedError

    # -- introspection (for `hetsched policies`) ------------------------
    @classmethod
    def parameters(cls) -> dict[str, Any]:
        sig = inspect.signature(cls.__init__)
        return {n: p.default for n, p in sig.parameters.items()
                if n != "self" and p.kind is p.KEYWORD_ONLY}

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.parameters()}


REGISTRY: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    REGISTRY[cls.name] = cls
    return cls


def make_policy(name: str, params: dict[str, Any] | None = None,
                source: str = "--policy") -> Policy:
    """Construct a registered policy, with errors that list what would be valid."""

    if name not in REGISTRY:
        raise InputError(source, f"unknown policy {name!r}; valid: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    params = dict(params or {})
    valid = cls.parameters()
    for k in params:
        if k not in valid:
            listing = ", ".join(f"{n}={v!r}" for n, v in valid.items()) or "none"
            raise InputError("--param", f"policy {name!r} has no parameter {k!r}; "
                             f"valid parameters: {listing}")
    try:
        return cls(**params)
    except (TypeError, ValueError) as e:
        raise InputError("--param", f"policy {name!r}: {e}") from None


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
