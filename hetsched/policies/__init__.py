"""Placement policies, registered by name (see ``hetsched policies``)."""

from hetsched.policies import allox, exhaustive, fifo, has, homo, jps, optimus  # noqa: F401
from hetsched.policies.base import REGISTRY, Policy, Snapshot, make_policy

__all__ = ["REGISTRY", "Policy", "Snapshot", "make_policy"]
