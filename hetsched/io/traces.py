"""Gavel job traces -> hetsched job specs (for examples and benchmarks on real traces)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hetsched.errors import InputError
from hetsched.io.files import read_text
from hetsched.io.profiles import workload_key

_NAME = re.compile(r"^(?P<model>.+?) \(batch size (?P<bs>\d+)\)$")

#: Approximate gradient sizes (fp32 parameters) of Gavel's models, in MB, for the
#: communication model; from the models' parameter counts (ResNet-18 11.7M,
#: ResNet-50 25.6M, Transformer base ~65M, the LSTM LM ~30M, the autoencoder
#: recommender ~40M). Good to a factor that matters little next to compute.
MODEL_SIZE_MB = {"resnet-18": 45.0, "resnet-50": 98.0, "transformer": 250.0, "lm": 120.0,
                 "recommendation": 160.0}


def parse_trace(path: str | Path, limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Read a Gavel trace; returns job dicts (jobs.yaml shape) and the count of skipped lines.

    Two layouts exist in Gavel's repository: 10 tab-separated fields
    (type, command, working dir, steps arg, needs data, total steps, scale
    factor, priority weight, SLO, arrival) and the 7-field MSR-derived one
    (type, command, steps arg, needs data, total steps, arrival, scale factor).
    Job types without a batch size (A3C, CycleGAN) are skipped.

    A trace's total steps count per-worker steps summed over the job's ``s``
    workers: Gavel's generator (``scheduler/utils.py`` ``generate_job``) sets
    ``num_steps = duration * throughputs[v100][(job_type, s)]['null']``, the
    aggregate rate at scale factor ``s``. So a job runs ``steps / s``
    synchronous iterations of ``batch * s`` samples: ``dataset_size = steps *
    batch`` (one epoch), ``global_batch = batch * s``.
    """
    p = Path(path)
    lines = read_text(p, "a Gavel trace").splitlines()
    jobs: list[dict[str, Any]] = []
    skipped = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        f = line.split("\t")
        try:
            if len(f) == 10:
                jtype, steps, scale, weight, arrival = f[0], int(f[5]), int(f[6]), float(f[7]), float(f[9])
            elif len(f) == 7:
                jtype, steps, arrival, scale, weight = f[0], int(f[4]), float(f[5]), int(f[6]), 1.0
            else:
                raise ValueError(f"{len(f)} fields, expected 10 or 7")
        except ValueError as e:
            raise InputError(str(p), f"not a Gavel trace line: {e}", f"line {lineno}") from None
        m = _NAME.match(jtype)
        if not m:
            skipped += 1
            continue
        wl = workload_key(m["model"])
        bs = int(m["bs"])
        gb = bs * scale
        jobs.append({
            "name": f"{wl}-{len(jobs):04d}",
            "workload": wl,
            "dataset_size": steps * bs,
            "epochs": 1,
            "global_batch": gb,
            "weight": weight,
            "arrival_s": arrival,
            "model_size_mb": MODEL_SIZE_MB.get(wl, 0.0),
            "requested_gpus": scale,
        })
        if limit is not None and len(jobs) >= limit:
            break
    if not jobs:
        raise InputError(str(p), "no usable jobs in the trace")
    return jobs, skipped
