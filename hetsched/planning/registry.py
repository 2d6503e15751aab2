"""The one policy registry of both sharing modes.

Every policy registers itself by a name that is unique across modes (space
mode's classes with ``@register``, pool mode's with ``@register_pool``; see
:mod:`hetsched.planning.base`). This module is where names are claimed,
resolved (with deprecated aliases), listed for ``hetsched policies`` with
their introspected, typed parameters, and where ``auto`` learns its
candidates.
"""

from __future__ import annotations

from typing import Any

from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.errors import InputError

MODES = ("space", "pool")
#: canonical name -> mode (names are unique across modes)
_NAMES: dict[str, str] = {}
#: (mode, former name) -> canonical name; an alias is only valid in its mode
_ALIASES: dict[tuple[str, str], str] = {}
#: the order auto tries its candidates in: by quality for their cost (planning/select.py
#: admits them in this order while their predicted counted work fits the budget). The
#: first always runs to its end, so it is the cheapest good one (optimus: ~1.5 ms per
#: event); then the other greedy and queue policies (cheap: they always fit below 1,000
#: jobs), then the searches: jps (40 sampled categories) before exhaustive (exact per
#: event, affordable on small clusters; first, it had taken the budget jps needed where
#: jps's plan is better) before has (every category). Unlisted registered policies
#: follow in name order
AUTO_ORDER = {
    "space": ("optimus", "optimus-lb", "fifo", "allox", "homo", "srtf", "jps", "exhaustive",
              "has"),
    "pool": ("hare", "pool-allox", "pool-srtf", "pool-homo", "pool-fifo"),
}


def claim(name: str, mode: str, alias_of: str | None = None) -> None:
    """Reserve ``name`` for a policy of ``mode`` (or, with ``alias_of``, a former name).

    A canonical name taken by a policy of another mode is an error; an alias
    is resolved only in its own mode, so ``fifo`` names space mode's FIFO and,
    deprecated, pool mode's ``pool-fifo``.
    """
    if alias_of is not None:
        _ALIASES[(mode, name)] = alias_of
        return
    have = _NAMES.get(name)
    if have is not None and have != mode:
        raise ValueError(f"policy name {name!r} is already registered in {have} mode; "
                         "policy names are unique across modes")
    _NAMES[name] = mode


def load() -> None:
    """Import every built-in policy module (registration happens on import)."""
    import hetsched.planning.pool.policies  # noqa: F401
    import hetsched.planning.space.policies  # noqa: F401


def policies(mode: str) -> dict[str, Any]:
    """name -> class of every registered policy of ``mode``."""
    load()
    if mode == "space":
        from hetsched.planning.space.policies.base import REGISTRY

        return dict(REGISTRY)
    if mode == "pool":
        from hetsched.planning.pool.policies import POOL_REGISTRY

        return dict(POOL_REGISTRY)
    raise InputError("--mode", f"unknown mode {mode!r}; expected {' or '.join(MODES)}")


def resolve(name: str, mode: str, reporter: BaseReporter = NULL_REPORTER) -> Any:
    """The class registered as ``name`` for ``mode``; a deprecated alias says so on the reporter."""
    load()
    reg = policies(mode)
    if name in reg:
        return reg[name]
    new = _ALIASES.get((mode, name))
    if new is not None and new in reg:
        reporter.note(f"policy name {name!r} is deprecated in {mode} mode; use {new!r}")
        return reg[new]
    valid = ", ".join([*sorted(reg), "auto"])
    other = _NAMES.get(name)
    hint = f" ({name!r} is a {other}-mode policy: add --mode {other})" if other else ""
    kind = "policy" if mode == "space" else f"{mode}-mode policy"
    raise InputError("--policy", f"unknown {kind} {name!r}; valid: {valid}{hint}")


def auto_candidates(mode: str) -> tuple[str, ...]:
    """What ``auto`` runs in ``mode``, in order: every registered policy with ``auto = True``."""
    reg = policies(mode)
    first = [n for n in AUTO_ORDER[mode] if n in reg]
    rest = sorted(n for n in reg if n not in first)
    return tuple(n for n in first + rest if reg[n].auto)


def listing() -> list[dict[str, Any]]:
    """Every policy of both modes (and each mode's ``auto``) for ``hetsched policies``."""
    rows: list[dict[str, Any]] = []
    for mode in MODES:
        reg = policies(mode)
        for name in sorted(reg):
            cls = reg[name]
            rows.append({
                "name": name, "mode": mode, "summary": cls.summary, "paper": cls.paper,
                "shares": getattr(cls, "shares", "-"),
                "preemptive": getattr(cls, "preemptive", "-"),
                "auto": bool(cls.auto),
                "aliases": list(cls.aliases),
                "parameters": {k: {"default": p.default, "type": p.type, "doc": p.doc}
                               for k, p in cls.param_info().items()},
            })
        rows.append({"name": "auto", "mode": mode, "summary": "Runs " + ", ".join(
            auto_candidates(mode)) + " (the first always; each other one when its predicted "
            "counted work fits "
            "the budget plan_budget_s) "
            "and keeps the lowest weighted JCT" + (" (the default)" if mode == "space" else ""),
            "paper": "-", "shares": "-", "preemptive": "-", "auto": False, "aliases": [],
            "parameters": {}})
    return rows


__all__ = ["claim", "load", "policies", "resolve", "auto_candidates", "listing", "AUTO_ORDER"]
