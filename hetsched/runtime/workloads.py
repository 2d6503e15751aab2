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
sequences), and two of realistic size for switching measurements: ``resnet50``
(ResNet-50's bottleneck layout, GroupNorm, 25.6 M parameters, 64x64 images) and
``bert-base`` (BERT-base's 12x768 ``nn.TransformerEncoder``, 110 M parameters).
None uses dropout or batch norm, whose per-rank randomness or
batch statistics would make heterogeneous steps differ from one large step.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os
import sys
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


class Bottleneck(nn.Module):
    """ResNet's 1x1-3x3-1x1 bottleneck with GroupNorm (no batch statistics, no buffers)."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4

        def gn(c: int) -> nn.GroupNorm:
            return nn.GroupNorm(32, c)

        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), gn(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), gn(width),
            nn.ReLU(), nn.Conv2d(width, cout, 1, bias=False), gn(cout))
        self.skip = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), gn(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50_model(classes: int = 1000) -> nn.Module:
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks; 25.6 M parameters), GroupNorm for BN."""
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
                               nn.GroupNorm(32, 64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for k in range(blocks):
            layers.append(Bottleneck(cin, width, stride if k == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def resnet50(dataset_size: int = 256, seed: int = 0, image: int = 64) -> Workload:
    """A ResNet-50-sized CNN on synthetic ``image``x``image`` images (random labels: it
    measures switching and step times at a realistic model size, not accuracy)."""
    g = torch.Generator().manual_seed(seed + 4)
    x = torch.randn(dataset_size, 3, image, image, generator=g)
    y = torch.randint(0, 1000, (dataset_size,), generator=g)
    return Workload(resnet50_model(), TensorDataset(x, y), nn.functional.cross_entropy,
                    _sgd(0.01))


class BertBase(nn.Module):
    """BERT-base's size: 30522-token embeddings, 12 encoder layers of width 768 (110 M
    parameters), a mean-pooled classifier; plain ``nn.TransformerEncoder``, no dropout."""

    def __init__(self, vocab: int = 30522, d: int = 768, layers: int = 12, seq: int = 128,
                 classes: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        layer = nn.TransformerEncoderLayer(d, nhead=12, dim_feedforward=4 * d, dropout=0.0,
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(tokens) + self.pos[: tokens.shape[1]])
        return self.head(h.mean(dim=1))


def bert_base(dataset_size: int = 256, seed: int = 0, seq: int = 128) -> Workload:
    """A BERT-base-sized encoder classifying synthetic token sequences of length ``seq``."""
    g = torch.Generator().manual_seed(seed + 5)
    tokens = torch.randint(0, 30522, (dataset_size, seq), generator=g)
    y = tokens[:, 0] % 2
    return Workload(BertBase(seq=max(seq, 128)), TensorDataset(tokens, y),
                    nn.functional.cross_entropy, lambda params: torch.optim.Adam(params, lr=1e-4))


BUILTINS: dict[str, Callable[..., Workload]] = {
    "mlp": mlp, "cnn": cnn, "transformer": transformer, "tiny-transformer": transformer,
    "resnet50": resnet50, "bert-base": bert_base,
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


def _check_from_workdir(mod_name: str, workdir: str | None) -> None:
    """A module this job's workdir holds must be the one imported. Jobs that share a
    process (a pool executor, a co-location group) import by name once: a second job's
    ``train.py`` in another workdir would silently get the first job's model."""
    top = mod_name.partition(".")[0]
    own = importlib.machinery.PathFinder.find_spec(top, [workdir]) if workdir else None
    loaded = getattr(sys.modules.get(top), "__file__", None)
    if own is not None and own.origin and loaded and \
            os.path.realpath(own.origin) != os.path.realpath(loaded):
        raise InputError("entrypoint", f"module {top!r} of {workdir} is already loaded in this "
                         f"process from {loaded}; jobs that share a process (a pool, a "
                         "co-location group) need module names of their own")


def load_workload(workload: str, *, entrypoint: str | None = None, dataset_size: int = 4096,
                  seed: int = 0, workdir: str | None = None) -> Workload:
    """Build the job's workload: its entrypoint when given, else a built-in by name.

    The entrypoint's module is imported from ``workdir`` (the job's, by default
    its jobs file's directory) first, then from the Python path.
    """
    torch.manual_seed(seed)
    if entrypoint:
        mod_name, _, fn_name = entrypoint.partition(":")
        if not mod_name or not fn_name:
            raise InputError("entrypoint", f"{entrypoint!r} is not 'module:function'")
        if workdir and workdir not in sys.path:
            sys.path.insert(0, workdir)
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            where = f"{workdir} or " if workdir else ""
            raise InputError("entrypoint", f"cannot import {mod_name!r} from {where}the Python "
                             f"path: {e}; put it in the job's workdir, install it, or add "
                             "its directory to PYTHONPATH") from None
        _check_from_workdir(mod_name, workdir)
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
