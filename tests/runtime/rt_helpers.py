"""Targets for the spawned ranks of the runtime tests (imported by basename in the children)."""

from __future__ import annotations

from typing import Any


def train_many(cfgs: list[Any], signal_last: tuple[int, float] | None = None) -> None:
    """One rank: join the group once, then run each config in turn (saves process starts).

    ``signal_last=(rank, seconds)``: that rank sends itself SIGTERM this long into
    the last config, as Slurm does to a step it cancels or requeues.
    """
    import os
    import signal
    import threading

    from hetsched.runtime.launcher import from_env, init_distributed, shutdown_distributed
    from hetsched.runtime.trainer import _train

    renv = from_env()
    dev = init_distributed(renv, "cpu", timeout_s=60)
    try:
        for i, cfg in enumerate(cfgs):
            if signal_last and i == len(cfgs) - 1 and renv.rank == signal_last[0]:
                threading.Timer(signal_last[1], os.kill,
                                (os.getpid(), signal.SIGTERM)).start()
            _train(cfg, renv, dev)
    finally:
        shutdown_distributed()
