"""The profile rows' optimizer shares, and how much one measurement moves a row.

A row's ``optimizer_s`` (the probe's measure of the optimizer step's share of the
step) is kept beside the row in the store's ``meta`` table under
:data:`OPTIMIZER_KEY` (JSON, ``"workload|gpu|batch" -> seconds``).
:func:`fold_weight` is the EWMA weight of a record that averages several
iterations (a pool job's task records: ``state.history.ingest_reports``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetsched.state.store import Store

#: the most one pool task record moves a step time (see :func:`fold_weight`)
MAX_TASK_ALPHA = 0.9
#: the meta key the rows' optimizer shares live under (JSON: "workload|gpu|batch" -> s)
OPTIMIZER_KEY = "profile_optimizer_s"


def share_of(opt: Mapping[tuple[str, str, int], float], r: Mapping[str, Any]) -> float | None:
    """A stored row's optimizer share, never above its step time (None: unknown)."""
    v = opt.get((r["workload"], r["gpu_type"], int(r["local_batch"])))
    return None if v is None else min(v, float(r["step_time_s"]))


def optimizer_shares(store: Store) -> dict[tuple[str, str, int], float]:
    """(workload, GPU type, local batch) -> the optimizer's share of that row's step."""
    return read_shares(store.conn)


def read_shares(c: Any) -> dict[tuple[str, str, int], float]:
    import json

    row = c.execute("SELECT value FROM meta WHERE key = ?", (OPTIMIZER_KEY,)).fetchone()
    try:
        raw = json.loads(row[0]) if row else {}
    except ValueError:
        return {}
    out: dict[tuple[str, str, int], float] = {}
    for k, v in (raw.items() if isinstance(raw, dict) else ()):
        parts = str(k).rsplit("|", 2)
        if len(parts) == 3 and parts[2].isdigit() and isinstance(v, (int, float)) \
                and math.isfinite(v) and v >= 0:
            out[(parts[0], parts[1], int(parts[2]))] = float(v)
    return out


def write_shares(c: Any, shares: Mapping[tuple[str, str, int], float]) -> None:
    import json

    body = {f"{w}|{g}|{b}": v for (w, g, b), v in sorted(shares.items())}
    c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
              (OPTIMIZER_KEY, json.dumps(body, sort_keys=True)))


def pair_optimizer_s(shares: Mapping[tuple[str, str, int], float], workload: str,
                     gpu_type: str) -> float | None:
    """The pair's optimizer share: the median over its rows (the fit's constant)."""
    vs = [v for (w, g, _), v in shares.items() if w == workload and g == gpu_type]
    return float(np.median(vs)) if vs else None


def fold_weight(alpha: float, iterations: int = 1) -> float:
    """The EWMA weight of a record that averages ``iterations`` iterations: as many
    observations of its mean, ``1 - (1 - alpha) ** iterations``; above one iteration
    at most :data:`MAX_TASK_ALPHA` (a single record never erases the history)."""
    if iterations <= 1:
        return alpha
    return max(alpha, min(MAX_TASK_ALPHA, 1 - (1 - alpha) ** iterations))
