"""Targets for the spawned ranks of the runtime tests (imported by basename in the children)."""

from __future__ import annotations

from typing import Any


def train_many(cfgs: list[Any]) -> None:
    """One rank: join the group once, then run each config in turn (saves process starts)."""
    from hetsched.runtime.launcher import from_env, init_distributed, shutdown_distributed
    from hetsched.runtime.trainer import _train

    renv = from_env()
    dev = init_distributed(renv, "cpu", timeout_s=60)
    try:
        for cfg in cfgs:
            _train(cfg, renv, dev)
    finally:
        shutdown_distributed()
