"""What the state file's journal costs: WAL against a rollback journal (``delete``).

hetsched picks the rollback journal on a network file system (state/fs.py), where WAL
is unsafe across hosts; this measures what that choice costs where both are safe, on
the file system of ``--dir``. Per mode, alternating ``--repeats`` times: opening the
store (every command does it once: the mountinfo read, the lock test, the schema
check), one write transaction (``add_event``, fsynced: ``synchronous = FULL``), and a
read (``events``). Medians in milliseconds.

Usage::

    python bench/bench_state_journal.py [--dir /tmp] [--writes 200] [--repeats 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODES = ("wal", "delete")


def run(folder: Path, mode: str, writes: int) -> dict[str, float]:
    from hetsched.state.store import open_store

    os.environ["HETSCHED_STATE_JOURNAL"] = mode
    path = folder / f"state-{mode}.db"
    opens, adds, reads = [], [], []
    with open_store(path):
        pass  # created
    for _ in range(10):
        t0 = time.perf_counter()
        with open_store(path):
            opens.append(time.perf_counter() - t0)
    with open_store(path) as st:
        for k in range(writes):
            t0 = time.perf_counter()
            st.add_event("job-completed", job=f"j{k}")
            adds.append(time.perf_counter() - t0)
        for _ in range(20):
            t0 = time.perf_counter()
            st.events()
            reads.append(time.perf_counter() - t0)
    for suffix in ("", "-wal", "-shm", ".bak"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return {"open_ms": 1e3 * statistics.median(opens),
            "write_ms": 1e3 * statistics.median(adds),
            "read_ms": 1e3 * statistics.median(reads)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="folder on the file system to measure (default: the temp folder)")
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    from hetsched.state.fs import filesystem_type

    folder = Path(tempfile.mkdtemp(dir=args.dir, prefix="hetsched-journal-bench-"))
    res: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    try:
        for _ in range(args.repeats):
            for mode in MODES:
                res[mode].append(run(folder, mode, args.writes))
    finally:
        folder.rmdir()
    out = {m: {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
           for m, rs in res.items()}
    meta = {"dir": args.dir, "filesystem": filesystem_type(args.dir),
            "machine": platform.platform(), "python": platform.python_version(),
            "command": " ".join(["python", *sys.argv]), "load": os.getloadavg()}
    if args.json:
        print(json.dumps({"meta": meta, "journal": out}, indent=1))
        return
    print(f"{meta['filesystem']} at {args.dir} ({args.repeats} x {args.writes} writes)")
    print(f"{'journal':8} {'open ms':>8} {'write ms':>9} {'read ms':>8}")
    for m, r in out.items():
        print(f"{m:8} {r['open_ms']:8.2f} {r['write_ms']:9.2f} {r['read_ms']:8.2f}")
    w, d = out["wal"]["write_ms"], out["delete"]["write_ms"]
    print(f"a write with the rollback journal: {d / w:.2f}x WAL's")


if __name__ == "__main__":
    main()
