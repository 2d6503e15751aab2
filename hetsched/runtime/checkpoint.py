"""Checkpoints: model, optimizer, sampler position, step and RNG states, written atomically.

Parameters are identical on every rank after each step (hetdp), so rank 0
alone writes. The file is written to a temporary name in the same directory,
fsynced and renamed over the old one, then the directory is fsynced: a crash
at any point leaves either the previous checkpoint or the new one, never half
a file. The sampler position is in samples of the epoch's permutation, so a
job may resume on a different number of ranks or share split (a replan that
moved it) and continue with the next unseen samples.

Loading never runs code from the file: ``torch.load(weights_only=True)``.
Format 2 stores the numpy and Python RNG states as tensors and plain
numbers, so nothing beyond torch's own allowlist is needed; format 1 files
(numpy arrays inside) are read with exactly the numpy globals an array needs
(:data:`FORMAT1_GLOBALS`). A file that is not a readable checkpoint raises
:class:`CheckpointError`: one line naming the file, no traceback.
"""

from __future__ import annotations

import pickle
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetsched.errors import InputError
from hetsched.io.files import atomic_write_with, check_private

FORMAT = 2
#: what a format-1 checkpoint's numpy RNG state needs to unpickle (arrays of uint32)
FORMAT1_GLOBALS: list[Any] = [np.ndarray, np.dtype, np.dtypes.UInt32DType]
_reconstruct = (getattr(np, "_core", None) or np.core).multiarray._reconstruct
FORMAT1_GLOBALS.append(_reconstruct)


class CheckpointError(InputError):
    """A checkpoint file that cannot be resumed from; one line, the file named."""

    def __init__(self, path: str | Path, message: str) -> None:
        super().__init__(str(path), f"{message}; move it away to start the job afresh, or "
                         "restore an older copy", None)


def _rng_state() -> dict[str, Any]:
    """The RNG states as tensors and plain numbers (loadable with weights_only=True)."""
    np_state: Any = np.random.get_state()
    name, keys, pos, has_gauss, cached = np_state
    version, internal, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": int(version), "state": list(internal), "gauss": gauss},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_numpy(st: Any) -> None:
    if isinstance(st, dict):  # format 2
        np.random.set_state((st["name"], st["keys"].numpy().astype(np.uint32), st["pos"],
                             st["has_gauss"], st["cached"]))
    else:
        np.random.set_state(st)


def _set_python(st: Any) -> None:
    if isinstance(st, dict):  # format 2
        random.setstate((st["version"], tuple(st["state"]), st["gauss"]))
    else:
        random.setstate(st)


def save_checkpoint(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    sampler: dict[str, Any], step: int, extra: dict[str, Any] | None = None
                    ) -> None:
    p = Path(path)
    state = {
        "format": FORMAT, "step": step, "sampler": sampler,
        "model": model.state_dict(), "optimizer": optimizer.state_dict(),
        "rng": _rng_state(), "extra": extra or {},
    }
    atomic_write_with(p, lambda f: torch.save(state, f), durable=True)


def load_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """The saved state, or None when there is no checkpoint yet.

    Raises :class:`CheckpointError` (one line) for a file that is truncated,
    corrupted, not a checkpoint, of an unknown format, or that would need code
    to run to load it.
    """
    p = Path(path)
    if not p.exists():
        return None
    check_private(p, "checkpoint")
    try:
        with torch.serialization.safe_globals(FORMAT1_GLOBALS), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's pickle-protocol notes: we say it in one line
            state = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        if "GLOBAL" in text or "Unsupported global" in text:
            raise CheckpointError(p, "refused: loading it would run code from the file "
                                  "(it names Python objects a checkpoint never holds)") from None
        raise CheckpointError(p, "not a readable checkpoint (corrupted or not a torch file)"
                              ) from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError,
            AttributeError, IndexError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(p, f"not a readable checkpoint: truncated or corrupted "
                              f"({first[:100]})") from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(p, "not a hetsched checkpoint (no 'format' entry)")
    if state.get("format") not in (1, FORMAT):
        raise CheckpointError(p, f"unknown checkpoint format {state.get('format')!r}; this "
                              f"hetsched reads formats 1 and {FORMAT}")
    missing = [k for k in ("step", "sampler", "model", "optimizer") if k not in state]
    if missing:
        raise CheckpointError(p, f"incomplete checkpoint: no {missing[0]!r}")
    return dict(state)


def restore(state: dict[str, Any], *, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer) -> None:
    """Load model, optimizer and RNG states saved by :func:`save_checkpoint`."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    rng = state.get("rng") or {}
    if rng.get("torch") is not None:
        torch.set_rng_state(rng["torch"])
    if rng.get("numpy") is not None:
        _set_numpy(rng["numpy"])
    if rng.get("python") is not None:
        _set_python(rng["python"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
