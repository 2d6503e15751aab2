"""Placement policies, registered by name (see ``hetsched policies``)."""

from hetsched.planning.space.policies import allox, exhaustive, fifo, has, homo, jps, optimus  # noqa: F401
from hetsched.planning.space.policies.base import REGISTRY, Policy, Snapshot, make_policy

__all__ = ["REGISTRY", "Policy", "Snapshot", "make_policy"]
