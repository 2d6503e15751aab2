"""Per-rank measurement reports: JSON lines the profiler (EWMA refinement) and monitor read.

Every rank appends records to one file per job. Each record is one line
written with a single ``os.write`` on an ``O_APPEND`` descriptor, so lines
from different ranks on one file system never interleave (lines are far below
the size where appends stop being atomic on local file systems). Kinds:

* ``steps``: a rank's mean over its last ``n`` steps: ``local_batch``,
  ``compute_s`` (forward+backward+optimizer, what the profiler calls
  step_time_s), ``sync_s`` (gradient all-reduce), ``step_s`` (wall time per
  iteration), ``samples_per_s`` (this rank's samples over step_s);
* ``epoch`` (rank 0): wall time of one epoch, its steps and global samples/s;
* ``done`` (rank 0): the run finished (steps, wall time, mean iteration time).

Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hetsched.io.files import private_dir


class ReportWriter:
    """Appends records for one rank of one job to its report file; a no-op when no path
    is given. (Planning progress goes to a ``core.report.BaseReporter``, not here.)"""

    def __init__(self, path: str | Path | None, **common: Any) -> None:
        self.path = Path(path) if path else None
        self.common = common
        if self.path is not None:
            private_dir(self.path.parent)

    def write(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        rec = {"t": round(time.time(), 3), "kind": kind, **self.common, **fields}
        line = (json.dumps(rec, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_reports(path: str | Path, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """Complete records after byte ``offset`` and the offset after the last complete line.

    A line still being written (no newline yet) is left for the next read.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    out: list[dict[str, Any]] = []
    for raw in data[:end].splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a torn line (crash mid-write on a network FS): skip it
        if isinstance(rec, dict):
            out.append(rec)
    return out, offset + end


def iter_records(path: str | Path, kind: str | None = None) -> Iterator[dict[str, Any]]:
    recs, _ = read_reports(path)
    for r in recs:
        if kind is None or r.get("kind") == kind:
            yield r
