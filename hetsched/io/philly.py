"""A Philly-derived synthetic job trace (seeded): jobs.yaml-shaped dicts, as traces.py gives.

No Philly data is on this machine (the public trace, msr-fiddle/philly-traces,
is 0.98 GB compressed). Every number below comes from published material
found through the tool library; where none was found, it says so.

* **GPUs per job** (Gavel's "scale factor"): 1 with probability 0.70, 2 with
  0.10, 4 with 0.15, 8 with 0.05. Source: Gavel (Narayanan et al., OSDI 2020),
  ``stanford-futuredata/gavel`` ``scheduler/utils.py`` ``_generate_scale_factor``
  ("Sample the scale factor from the Philly distribution").
* **Duration** (on the reference GPU type, V100, at that GPU count):
  ``60 * 10**U(1.5, 3)`` s with probability 0.8 (32 min to 16.7 h) and
  ``60 * 10**U(3, 4)`` s with probability 0.2 (16.7 h to 6.9 days). Source:
  the same file, ``_generate_duration`` ("Sample the job duration from the
  Philly distribution"). Mean: 0.8 * 280.4 + 0.2 * 3908.7 = 1006 min.
* **Job type**: uniform over the profile table's (model, batch size) entries,
  as Gavel's ``generate_job`` draws ``rng.choice(JobTable)``. Steps follow
  Gavel's rule ``num_steps = duration * throughput[v100][(type, s)]``: the job
  runs ``duration / step_time(v100, batch, s)`` synchronous iterations of
  ``batch * s`` samples, with the step time the table measured at ``s`` GPUs
  (traces.py reads Gavel's own traces the same way).
* **Arrivals**: a Poisson process (exponential gaps), as Gavel's generator
  (``generate_interarrival_time``: ``-ln(1 - U) * lam``) and as
  ``marwage/philly-traces`` ``analysis/fit_arrivals.py`` fits Philly's
  inter-arrival gaps (``scipy.stats.expon``). The *rate* is not a Philly
  number that scales to a small partition: the public trace holds 117,325
  jobs submitted 2017-08-07 .. 2017-12-22 (its README), about 35 jobs/h over
  the whole Philly cluster, whose GPU count that README does not give. So the
  rate is set from an offered load: ``load`` = mean V100 GPU-seconds asked
  per second / ``gpus`` (Gavel sweeps its rate the same way).
* **Diurnal / bursty arrivals**: no published Philly statistic for them was
  found through the library (the ATC'19 paper's figures are not in it). An
  optional day-period sinusoidal modulation of the rate, amplitude
  ``diurnal`` in [0, 1), is offered (thinning); it is 0 by default and its
  shape is an assumption, not a Philly number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from hetsched.core.throughput import ProfileRow
from hetsched.io.traces import MODEL_SIZE_MB

#: GPUs per job and their probabilities (Gavel's Philly distribution)
SCALE_FACTORS = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
#: (probability, log10-minutes range) of the duration mixture (Gavel's Philly distribution)
DURATION_MIX = ((0.8, (1.5, 3.0)), (0.2, (3.0, 4.0)))
REFERENCE_TYPE = "v100"
DAY_S = 86400.0


def mean_duration_s() -> float:
    """E[duration] of the mixture: E[10**U(a, b)] = (10**b - 10**a) / ((b - a) ln 10)."""
    return 60.0 * sum(p * (10 ** b - 10 ** a) / ((b - a) * math.log(10))
                      for p, (a, b) in DURATION_MIX)


def mean_gpus() -> float:
    return sum(s * p for s, p in SCALE_FACTORS)


def _step_times(rows: Iterable[ProfileRow]) -> dict[tuple[str, int, int], float]:
    return {(r.workload, r.local_batch, r.gpus): r.step_time_s for r in rows
            if r.gpu_type == REFERENCE_TYPE and r.colocated_with is None}  # isolated runs only


def _arrivals(rng: np.random.Generator, n: int, mean_gap_s: float, diurnal: float) -> np.ndarray:
    """n Poisson arrivals of mean gap ``mean_gap_s``; rate x (1 + diurnal sin(2 pi t / day))."""
    if diurnal <= 0:
        return np.concatenate([[0.0], np.cumsum(rng.exponential(mean_gap_s, n - 1))])
    peak = (1.0 + diurnal) / mean_gap_s  # thinning of a rate-`peak` process
    out, t = [0.0], 0.0
    while len(out) < n:
        t += rng.exponential(1.0 / peak)
        if rng.random() * peak <= (1.0 + diurnal * math.sin(2 * math.pi * t / DAY_S)) / mean_gap_s:
            out.append(t)
    return np.array(out)


def philly_jobs(rows: Iterable[ProfileRow], n: int, *, gpus: int, load: float = 1.0,
                seed: int = 0, diurnal: float = 0.0) -> list[dict[str, Any]]:
    """``n`` jobs with Philly-derived sizes, durations and Poisson arrivals (module doc).

    ``rows``: a profile table with multi-GPU rows on the reference type (e.g.
    examples/gavel_throughputs.csv); ``gpus``: the partition's GPU count the
    ``load`` is relative to. Same seed, same trace.
    """
    if n < 1 or gpus < 1 or load <= 0 or not 0 <= diurnal < 1:
        raise ValueError("need n >= 1, gpus >= 1, load > 0 and 0 <= diurnal < 1")
    st = _step_times(rows)
    types = sorted({(w, b) for w, b, g in st if g == 1})
    if not types:
        raise ValueError(f"the profile table has no single-GPU {REFERENCE_TYPE} rows")
    rng = np.random.default_rng(seed)
    mean_gap = mean_gpus() * mean_duration_s() / (load * gpus)
    arrivals = _arrivals(rng, n, mean_gap, diurnal)
    jobs = []
    for k in range(n):
        s = int(rng.choice([f for f, _ in SCALE_FACTORS], p=[p for _, p in SCALE_FACTORS]))
        p_lo = DURATION_MIX[0][0]
        a, b = DURATION_MIX[0][1] if rng.random() < p_lo else DURATION_MIX[1][1]
        duration = 60.0 * 10 ** rng.uniform(a, b)
        cands = [t for t in types if (t[0], t[1], s) in st]
        wl, bs = cands[int(rng.integers(len(cands)))]
        iters = max(1, round(duration / st[(wl, bs, s)]))
        jobs.append({"name": f"{wl}-{k:04d}", "workload": wl, "dataset_size": iters * bs * s,
                     "epochs": 1, "global_batch": bs * s, "weight": 1.0,
                     "arrival_s": float(arrivals[k]), "model_size_mb": MODEL_SIZE_MB.get(wl, 0.0),
                     "requested_gpus": s})
    return jobs
