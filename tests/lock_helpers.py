"""A replan holding the batch's lock (app/batch_lock.py) while a test runs a command."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hetsched.app.batch_lock import lock_path, replan_lock
from hetsched.state.store import Store


@contextlib.contextmanager
def a_replan_holding(state: Store | Path, seconds: float) -> Iterator[None]:
    """The body runs while a replan (this process, another thread) holds the lock of the
    batch of ``state`` for ``seconds``; the thread is joined when the body ends."""
    held = threading.Event()

    def a_replan() -> None:
        with replan_lock(lock_path(state)):
            held.set()
            time.sleep(seconds)

    t = threading.Thread(target=a_replan)
    t.start()
    held.wait(5)
    try:
        yield
    finally:
        t.join()
