"""Targets for the spawned ranks of the runtime tests (imported by basename in the children)."""

from __future__ import annotations

from typing import Any


def train_many(cfgs: list[Any], signal_last: tuple[int, float] | None = None,
               rescale_last: tuple[int, str, list[int]] | None = None) -> None:
    """One rank: join the group once, then run each config in turn (saves process starts).

    ``signal_last=(rank, seconds)``: that rank sends itself SIGTERM this long into
    the last config, as Slurm does to a step it cancels or requeues.
    ``rescale_last=(step, path, local_batches)``: once the last config's report
    shows that step, rank 0 writes that rescale request, as a replan does.
    """
    import os
    import signal
    import threading

    from hetsched.runtime.launcher import from_env
    from hetsched.runtime.rendezvous import init_distributed, shutdown_distributed
    from hetsched.runtime.trainer import _train

    renv = from_env()
    dev = init_distributed(renv, "cpu", timeout_s=60)
    try:
        for i, cfg in enumerate(cfgs):
            if signal_last and i == len(cfgs) - 1 and renv.rank == signal_last[0]:
                threading.Timer(signal_last[1], os.kill,
                                (os.getpid(), signal.SIGTERM)).start()
            if rescale_last and i == len(cfgs) - 1 and renv.rank == 0:
                threading.Thread(target=_rescale_when, args=(cfg.report, *rescale_last),
                                 daemon=True).start()
            _train(cfg, renv, dev)
    finally:
        shutdown_distributed()


def _rescale_when(report: str, step: int, path: str, batches: list[int]) -> None:
    import time

    from hetsched.io.reports import iter_records
    from hetsched.runtime.elastic import write_request

    while not any(r.get("step", 0) >= step for r in iter_records(report, "steps")):
        time.sleep(0.01)
    write_request(path, batches)


def group_signalled(cfg: Any, rank: int, report: str, step: int) -> None:
    """One rank of a co-location group; ``rank`` sends itself SIGTERM once ``report``
    (a member's report) shows ``step``, as Slurm does to a step it requeues."""
    import os
    import signal
    import threading
    import time

    from hetsched.io.reports import iter_records
    from hetsched.runtime.group import run_group
    from hetsched.runtime.launcher import from_env

    renv = from_env()

    def watch() -> None:
        while not any(r.get("step", 0) >= step for r in iter_records(report, "steps")):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    if renv.rank == rank:
        threading.Thread(target=watch, daemon=True).start()
    run_group(cfg, renv)
