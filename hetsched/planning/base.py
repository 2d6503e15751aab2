"""What every policy is, in both sharing modes, and how a new one plugs in.

A policy is a class with a unique ``name`` (unique across modes: the pool
baselines are ``pool-fifo``, ``pool-srtf``, ... beside space mode's ``fifo``,
``srtf``, ...), a ``mode`` (``"space"`` or ``"pool"``), a one-line
``summary``, the ``paper`` it comes from, and keyword-only constructor
parameters with defaults and type annotations. ``hetsched policies`` lists
them, ``--param key=value`` sets them (converted and checked against the
annotation), and ``auto`` runs every registered policy of its mode that it
can afford (:mod:`hetsched.planning.select`).

Adding a space-mode policy (one decision per reset event)::

    from hetsched.planning.space.policies.base import Policy, Snapshot, register

    @register
    class Mine(Policy):
        name = "mine"
        paper = "Someone et al., 2025"
        summary = "what it does, in one line"
        param_docs = {"depth": "how far it looks ahead"}

        def __init__(self, *, depth: int = 3) -> None:
            self.depth = int(depth)

        def allocate(self, problem, snap: Snapshot) -> np.ndarray:
            ...  # GPUs per type for each job in snap.jobs; zero rows wait

and import its module in ``hetsched/planning/space/policies/__init__.py``.
The evaluator owns time, placement, batch shares, restart costs and the
objective. Use ``problem.estimates`` (:mod:`hetsched.core.estimates`) for
memo tables; never attach attributes to the problem.

Adding a pool-mode policy: subclass
:class:`hetsched.planning.pool.policies.PoolPolicy` the same way, decorate it
with ``hetsched.planning.pool.policies.register_pool`` and return a
``TaskSchedule`` from ``schedule(pp, relaxation)``.

Optional class attributes every policy may set:

* ``auto = False`` keeps it out of ``auto`` (experimental or redundant);
* ``cost(problem)`` (classmethod): predicted planning seconds, or ``None``
  when cheap; ``auto`` skips a policy whose prediction exceeds its time
  budget (setting ``plan_budget_s``) and says so in the plan.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from hetsched.errors import InputError, PlanningError


class OverBudget(PlanningError):
    """A candidate ran past its share of ``auto``'s budget; auto skips it and says so.

    ``work_s``: the work it had counted when it stopped (reference seconds).
    """

    def __init__(self, message: str, work_s: float = 0.0) -> None:
        super().__init__(message)
        self.work_s = float(work_s)


@dataclass(frozen=True)
class Param:
    """One policy parameter: its default, its type name and what it does."""

    name: str
    default: Any
    type: str
    doc: str


_CONVERT = {"int": int, "float": float, "str": str, "bool": bool}


class BasePolicy:
    """Named, documented, typed parameters; subclasses add the mode's decision method."""

    name: ClassVar[str] = ""
    mode: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    param_docs: ClassVar[dict[str, str]] = {}
    #: run by ``auto`` (when affordable)
    auto: ClassVar[bool] = True
    #: former names that still work, with a deprecation line
    aliases: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """Keyword-only constructor parameters and their defaults."""
        sig = inspect.signature(cls.__init__)
        return {n: p.default for n, p in sig.parameters.items()
                if n != "self" and p.kind is p.KEYWORD_ONLY}

    @classmethod
    def param_info(cls) -> dict[str, Param]:
        """:meth:`parameters` with their types (from the annotations) and docs."""
        sig = inspect.signature(cls.__init__)
        out = {}
        for n, p in sig.parameters.items():
            if n == "self" or p.kind is not p.KEYWORD_ONLY:
                continue
            ann = p.annotation if isinstance(p.annotation, str) else getattr(
                p.annotation, "__name__", "")
            if not ann or ann is inspect.Parameter.empty:
                ann = type(p.default).__name__
            out[n] = Param(n, p.default, str(ann), cls.param_docs.get(n, ""))
        return out

    @classmethod
    def cost(cls, problem: Any) -> float | None:
        """Predicted planning seconds on ``problem`` with default parameters; None: cheap."""
        return None

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.parameters()}

    @classmethod
    def build(cls, params: dict[str, Any] | None = None, source: str = "--param") -> Any:
        """An instance from user parameters: unknown names and bad values are InputErrors."""
        params = dict(params or {})
        info = cls.param_info()
        for k, v in params.items():
            if k not in info:
                listing = ", ".join(f"{n}={p.default!r}" for n, p in info.items()) or "none"
                raise InputError(source, f"policy {cls.name!r} has no parameter {k!r}; "
                                 f"valid parameters: {listing}")
            want = info[k].type
            if want == "int" and isinstance(v, float) and v.is_integer():
                params[k] = int(v)
            elif want == "float" and isinstance(v, int) and not isinstance(v, bool):
                params[k] = float(v)
            elif want in _CONVERT and not isinstance(params[k], _CONVERT[want]) or (
                    want in ("int", "float") and isinstance(v, bool)):
                raise InputError(source, f"policy {cls.name!r}: {k} must be {want}, got {v!r}")
        try:
            return cls(**params)
        except (TypeError, ValueError) as e:
            raise InputError(source, f"policy {cls.name!r}: {e}") from None


__all__ = ["BasePolicy", "Param", "OverBudget"]
