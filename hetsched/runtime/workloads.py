"""Workloads: what a training job computes. Built-ins and the ``module:function`` contract.

A workload provides four things (:class:`Workload`):

* ``model``: a ``torch.nn.Module``;
* ``dataset``: a ``torch.utils.data.Dataset`` (``TensorDataset`` is fastest: batches
  are gathered by indexing its tensors) of ``(input, target)`` pairs;
* ``loss_fn(output, target)``: the **mean** loss over the batch (hetdp weights it by
  the local batch; do not use ``reduction='sum'``);
* ``optimizer(params)``: a factory returning the optimizer.

A job spec's ``entrypoint: "package.module:function"`` names a function
``function(dataset_size: int, seed: int) -> Workload | dict`` (a dict with those
four keys is accepted; parameters it does not declare are not passed). It is
called on every rank after ``torch.manual_seed(seed)``; rank 0's initial
parameters are broadcast anyway.

Built-ins, on synthetic data each generates from its seed (labels come from a
fixed random "teacher", so the loss really falls): ``mlp``, ``cnn`` (small
conv net on 3x16x16 images) and ``transformer`` (one encoder layer on token
sequences). None uses dropout or batch norm, whose per-rank randomness or
batch statistics would make heterogeneous steps differ from one large step.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from hetsched.errors import InputError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimFactory = Callable[[Any], torch.optim.Optimizer]


@dataclass
class Workload:
    model: nn.Module
    dataset: Dataset[Any]
    loss_fn: LossFn
    optimizer: OptimFactory


def _sgd(lr: float = 0.05) -> OptimFactory:
    return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)


def _teacher_labels(x: torch.Tensor, classes: int, g: torch.Generator) -> torch.Tensor:
    w = torch.randn(x[0].numel(), classes, generator=g)
    return (x.reshape(len(x), -1) @ w).argmax(dim=1)


def mlp(dataset_size: int = 4096, seed: int = 0) -> Workload:
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(dataset_size, 64, generator=g)
    y = _teacher_labels(x, 10, g)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    return Workload(model, TensorDataset(x, y), nn.functional.cross_entropy, _sgd())


def cnn(dataset_size: int = 2048, seed: int = 0) -> Workload:
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(dataset_size, 3, 16, 16, generator=g)
    y = _teacher_labels(x, 10, g)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))
    return Workload(model, TensorDataset(x, y), nn.functional.cross_entropy, _sgd(0.02))


class TinyTransformer(nn.Module):
    """Embedding + one encoder layer + mean-pool classifier over token sequences."""

    def __init__(self, vocab: int = 64, d: int = 32, seq: int = 16, classes: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.enc = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=64, dropout=0.0,
                                              batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(tokens) + self.pos)
        return self.head(h.mean(dim=1))


def transformer(dataset_size: int = 2048, seed: int = 0) -> Workload:
    g = torch.Generator().manual_seed(seed + 3)
    tokens = torch.randint(0, 64, (dataset_size, 16), generator=g)
    y = (tokens[:, :4].sum(dim=1) % 8)  # a rule the model can learn
    return Workload(TinyTransformer(), TensorDataset(tokens, y), nn.functional.cross_entropy,
                    lambda params: torch.optim.Adam(params, lr=3e-3))


BUILTINS: dict[str, Callable[..., Workload]] = {
    "mlp": mlp, "cnn": cnn, "transformer": transformer, "tiny-transformer": transformer,
}


def _from_result(res: Any, source: str) -> Workload:
    if isinstance(res, Workload):
        return res
    if isinstance(res, Mapping):
        missing = [k for k in ("model", "dataset", "loss_fn", "optimizer") if k not in res]
        if missing:
            raise InputError(source, f"the entrypoint's result lacks {missing[0]!r}; it must "
                             "return a Workload or a dict with model, dataset, loss_fn, "
                             "optimizer")
        return Workload(res["model"], res["dataset"], res["loss_fn"], res["optimizer"])
    raise InputError(source, f"the entrypoint returned {type(res).__name__}; expected a "
                     "Workload or a dict with model, dataset, loss_fn, optimizer")


def load_workload(workload: str, *, entrypoint: str | None = None, dataset_size: int = 4096,
                  seed: int = 0) -> Workload:
    """Build the job's workload: its entrypoint when given, else a built-in by name."""
    torch.manual_seed(seed)
    if entrypoint:
        mod_name, _, fn_name = entrypoint.partition(":")
        if not mod_name or not fn_name:
            raise InputError("entrypoint", f"{entrypoint!r} is not 'module:function'")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise InputError("entrypoint", f"cannot import {mod_name!r}: {e}") from None
        fn = getattr(mod, fn_name, None)
        if not callable(fn):
            raise InputError("entrypoint", f"{mod_name!r} has no function {fn_name!r}")
        accepted = inspect.signature(fn).parameters
        kwargs = {k: v for k, v in (("dataset_size", dataset_size), ("seed", seed))
                  if k in accepted}
        return _from_result(fn(**kwargs), f"entrypoint {entrypoint}")
    build = BUILTINS.get(workload)
    if build is None:
        raise InputError("workload", f"{workload!r} is not a built-in workload (built-ins: "
                         f"{', '.join(sorted(BUILTINS))}); give the job an entrypoint "
                         "'module:function' or a command")
    return build(dataset_size=dataset_size, seed=seed)


def gather(dataset: Dataset[Any], idx: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch at indices ``idx`` (a TensorDataset is indexed directly, no per-item copies)."""
    if isinstance(dataset, TensorDataset):
        i = torch.as_tensor(idx, dtype=torch.long)
        x, y = (t[i] for t in dataset.tensors[:2])
        return x, y
    from torch.utils.data import default_collate

    batch = default_collate([dataset[int(i)] for i in idx])
    return batch[0], batch[1]
