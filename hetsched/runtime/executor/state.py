"""A job's parameters as one flat float32 buffer, and its round-boundary checkpoints.

``<checkpoint_dir>/<plan_id>/<job>.pt`` holds ``{format, job, rounds_done,
rounds, names, params (flat), optimizer}``: plain tensors, numbers and
strings, so ``torch.load(weights_only=True)`` reads it. It is written to a
temporary file, fsynced and renamed; then the sidecar ``<job>.json``
(``{rounds_done, rounds}``) is written the same way, which
:func:`hetsched.io.pool_reports.completed_rounds` reads without torch. The
sidecar never claims more rounds than the ``.pt`` holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hetsched.io.files import atomic_write_with, check_private

FORMAT = 1


def flatten_params(model: nn.Module) -> tuple[torch.Tensor, list[str]]:
    """Move every parameter into one flat float32 tensor the parameters then view."""
    named = [(n, p) for n, p in model.named_parameters()]
    for n, p in named:
        if p.dtype != torch.float32:
            raise ValueError(f"parameter {n} is {p.dtype}; the executor handles float32 models")
    flat = torch.cat([p.detach().reshape(-1) for _, p in named]) if named else torch.zeros(0)
    return rebind_params(model, flat), [n for n, _ in named]


def rebind_params(model: nn.Module, flat: torch.Tensor) -> torch.Tensor:
    """Make the parameters views of ``flat`` (which must already hold their values in
    order, e.g. a shared memory segment they were copied into); returns ``flat``."""
    off = 0
    for p in model.parameters():
        k = p.numel()
        p.data = flat[off:off + k].view_as(p)
        off += k
    return flat


def attach_grads(model: nn.Module, grad: torch.Tensor) -> None:
    off = 0
    for p in model.parameters():
        k = p.numel()
        p.grad = grad[off:off + k].view_as(p)
        off += k


def checkpoint_path(ckpt_dir: Path, plan_id: str, job: str) -> Path:
    return Path(ckpt_dir) / plan_id / f"{job}.pt"


def _atomic(path: Path, write: Any) -> None:
    atomic_write_with(path, write, durable=True)


def save_job_checkpoint(path: Path, flat: torch.Tensor, names: list[str],
                        optimizer: dict[str, Any], rounds_done: int, rounds: int) -> None:
    state = {"format": FORMAT, "job": path.stem, "rounds_done": rounds_done, "rounds": rounds,
             "names": names, "params": flat, "optimizer": optimizer}
    _atomic(path, lambda f: torch.save(state, f))
    side = json.dumps({"rounds_done": rounds_done, "rounds": rounds}).encode()
    _atomic(path.with_suffix(".json"), lambda f: f.write(side))


def load_job_checkpoint(path: Path, names: list[str]) -> dict[str, Any] | None:
    """The saved state, or None when the job has no checkpoint yet.

    A truncated, corrupted, foreign or crafted file is one line
    (:class:`~hetsched.runtime.checkpoint.CheckpointError`), never a traceback and
    never code run (``weights_only``).
    """
    import pickle
    import warnings

    from hetsched.runtime.checkpoint import CheckpointError

    if not path.exists():
        return None
    check_private(path, "pool checkpoint")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        why = ("refused: loading it would run code from the file" if "GLOBAL" in str(e)
               or "Unsupported global" in str(e) else "not a readable pool checkpoint")
        raise CheckpointError(path, why) from None
    except (RuntimeError, EOFError, OSError, ValueError, TypeError, KeyError,
            AttributeError, IndexError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(path, f"not a readable pool checkpoint: truncated or corrupted "
                              f"({first[:100]})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT \
            or list(state.get("names", [])) != names:
        got = state if isinstance(state, dict) else {}
        raise CheckpointError(path, f"not a checkpoint of this job's model (format "
                              f"{got.get('format')!r}, {len(got.get('names', []) or [])} "
                              f"parameters, the model has {len(names)})")
    params = state.get("params")
    rounds = state.get("rounds_done")
    if not isinstance(params, torch.Tensor) or isinstance(rounds, bool) \
            or not isinstance(rounds, int) or rounds < 0 or "optimizer" not in state:
        raise CheckpointError(path, "incomplete pool checkpoint (params, rounds_done, "
                              "optimizer)")
    return state
