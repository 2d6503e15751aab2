"""Memoised model estimates of one planning problem, shared by every policy.

Policies evaluate the same (job, GPU counts) pairs at event after event and
candidate after candidate (``auto`` runs several on one problem). The values
depend only on the problem, so they are kept here, in one explicit object
that the problem owns (``problem.estimates``), rather than hung on the
problem by each policy. ``clear()`` forgets them (benchmarks time cold runs).

Each table is a plain dict filled by whoever computes the value first; the
values are deterministic, so two candidates that race on one key (auto's
parallel candidates) store the same number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hetsched.core.problem import PlanningProblem

#: per job: (intercepts, slopes, local-batch caps, allowed) per GPU type as plain lists
Row = tuple[list[float], list[float], list[float], list[bool]]


@dataclass
class Bound:
    """A lower bound on total weighted JCT and which relaxation gave it."""

    value: float
    method: str


@dataclass
class Estimates:
    """Plain-Python copies of the problem's arrays and the memo tables built on them."""

    rows: list[Row]
    batch: list[float]
    model_mb: list[float]
    sync: list[list[float]]
    node_max: list[int]
    #: (job, counts) -> policy-side iteration time (balanced shares)
    iter_time: dict[tuple[int, tuple[int, ...]], float] = field(default_factory=dict)
    #: (job, counts) -> iteration time with equal shares (the baselines' papers)
    equal_iter_time: dict[tuple[int, tuple[int, ...]], float] = field(default_factory=dict)
    #: job -> GPU types from fastest to slowest (peak per-GPU rate)
    fastest: dict[int, list[int]] = field(default_factory=dict)
    #: job -> GPU types by decreasing local-batch cap
    by_memory: dict[int, list[int]] = field(default_factory=dict)
    #: job -> iteration time on its minimal feasible set of the whole cluster
    minimal_time: dict[int, float] = field(default_factory=dict)
    #: job -> its minimal feasible per-type counts on the whole cluster
    minimal_set: dict[int, np.ndarray] = field(default_factory=dict)
    #: share mode -> (job, counts, type) -> step-time gain of one more GPU of that type
    gain: dict[str, dict[tuple[int, tuple[int, ...], int], float]] = field(default_factory=dict)
    #: job -> what its iteration times depend on (PlanningProblem.model_key)
    model_key: dict[int, tuple] = field(default_factory=dict)
    #: the lower bound, computed once per problem (space mode; see planning.bounds)
    bound: Bound | None = None
    #: whether that bound may solve the joint LP (pool mode plans its space seed with it
    #: off: that plan's bound is only reported there, and the LP was most of its time)
    joint_lp: bool = True
    #: anything else a policy wants to keep per problem, under a name it owns
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, p: PlanningProblem) -> Estimates:
        S = len(p.jobs)
        return cls(
            rows=[(p.a[i].tolist(), p.c[i].tolist(), p.cap[i].astype(float).tolist(),
                   p.allowed[i].tolist()) for i in range(S)],
            batch=p.B.astype(float).tolist(), model_mb=p.model_mb.tolist(),
            sync=p.sync.tolist(), node_max=p.node_max.tolist())

    def clear(self) -> None:
        """Forget every memoised value (the plain copies stay)."""
        for d in (self.iter_time, self.equal_iter_time, self.fastest, self.by_memory,
                  self.minimal_time, self.minimal_set, self.gain, self.model_key, self.extra):
            d.clear()
        self.bound = None


__all__ = ["Estimates", "Bound", "Row"]
