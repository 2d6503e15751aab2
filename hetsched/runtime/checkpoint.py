"""Checkpoints: model, optimizer, sampler position, step and RNG states, written atomically.

Parameters are identical on every rank after each step (hetdp), so rank 0
alone writes. The file is written to a temporary name in the same directory,
fsynced and renamed over the old one, then the directory is fsynced: a crash
at any point leaves either the previous checkpoint or the new one, never half
a file. The sampler position is in samples of the epoch's permutation, so a
job may resume on a different number of ranks or share split (a replan that
moved it) and continue with the next unseen samples.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = 1


def save_checkpoint(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler: dict[str, Any], step: int, extra: dict[str, Any] | None = None
                    ) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": FORMAT, "step": step, "sampler": sampler,
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "extra": extra or {},
    }
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """The saved state, or None when there is no checkpoint yet.

    ``weights_only=False`` because the state holds numpy and Python RNG states;
    the file is one hetsched wrote itself into the user's own state directory.
    """
    p = Path(path)
    if not p.exists():
        return None
    state: dict[str, Any] = torch.load(p, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ValueError(f"{p}: unknown checkpoint format {state.get('format')!r}")
    return state


def restore(state: dict[str, Any], *, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> None:
    """Load model, optimizer and RNG states saved by :func:`save_checkpoint`."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state.get("rng") or {}
    if rng.get("torch") is not None:
        torch.set_rng_state(rng["torch"])
    if rng.get("numpy") is not None:
        np.random.set_state(rng["numpy"])
    if rng.get("python") is not None:
        random.setstate(rng["python"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
