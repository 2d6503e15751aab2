"""Placement policies, registered by name (see ``hetsched policies``)."""

from hetsched.planning.space.policies import (  # noqa: F401
    allox,
    drf,
    exhaustive,
    fifo,
    harmony,
    harmony_jct,
    has,
    homo,
    jps,
    las,
    ones,
    opd,
    optimus,
)
from hetsched.planning.space.policies.base import REGISTRY, Policy, Snapshot, make_policy

__all__ = ["REGISTRY", "Policy", "Snapshot", "make_policy"]
