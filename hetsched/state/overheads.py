"""The pool executor's per-task overhead in the profile history: the critical-path time
between two tasks' computes that its reports measure (``overhead_s``), an EWMA per
(workload, GPU type) kept in the state file's meta table, which pool planning adds to
every task (``planning.pool.problem.PoolProblem.task_overhead_s``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hetsched.state.store import Store

#: the meta key the per-(workload, GPU type) EWMA lives under (JSON), and the table attribute
TASK_OVERHEAD_KEY = "pool_task_overhead"
TASK_OVERHEAD_ATTR = "task_overhead_s"


def task_overheads(store: Store) -> dict[tuple[str, str], float]:
    """(workload, GPU type) -> seconds a pool task costs the GPU beyond its compute
    (its ``overhead_s`` in the executors' reports, an EWMA like the step times)."""
    import json

    with store.tx() as c:
        row = c.execute("SELECT value FROM meta WHERE key = ?", (TASK_OVERHEAD_KEY,)).fetchone()
    try:
        raw = json.loads(row[0]) if row else {}
    except ValueError:
        return {}
    out: dict[tuple[str, str], float] = {}
    for k, v in raw.items():
        w, _, g = str(k).rpartition("|")
        if w and isinstance(v, (int, float)) and math.isfinite(v) and v >= 0:
            out[(w, g)] = float(v)
    return out


def fold_overhead(c: Any, rec: dict[str, Any], workloads: Mapping[str, str],
                   alpha: float) -> None:
    """One pool ``task`` record's ``overhead_s`` into the per-(workload, type) EWMA."""
    import json

    ov, job, g = rec.get("overhead_s"), rec.get("job"), rec.get("gpu_type")
    if not isinstance(ov, (int, float)) or not math.isfinite(ov) or ov < 0 or not g:
        return
    w = workloads.get(str(job))
    if not w:
        return
    row = c.execute("SELECT value FROM meta WHERE key = ?", (TASK_OVERHEAD_KEY,)).fetchone()
    try:
        cur = json.loads(row[0]) if row else {}
    except ValueError:
        cur = {}
    key = f"{w}|{str(g).lower()}"
    old = cur.get(key)
    cur[key] = float(ov) if not isinstance(old, (int, float)) else \
        (1 - alpha) * float(old) + alpha * float(ov)
    c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
              (TASK_OVERHEAD_KEY, json.dumps(cur, sort_keys=True)))



__all__ = ["TASK_OVERHEAD_ATTR", "TASK_OVERHEAD_KEY", "fold_overhead", "task_overheads"]
