"""Throughput profile files: the CSV format and Gavel's measured throughputs.

See docs/formats.md. The step-time fit these rows feed is
:mod:`hetsched.core.throughput`.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path

from hetsched.core import limits
from hetsched.core.spec import WORKLOAD_RE, WORKLOAD_VALID
from hetsched.core.throughput import (
    CSV_COLUMNS,
    OPTIONAL_COLUMNS,
    ProfileRow,
    ThroughputTable,
)
from hetsched.errors import InputError
from hetsched.io.files import read_text


def parse_csv(text: str, source: str) -> list[ProfileRow]:
    """Parse the throughput CSV (see docs/formats.md) with line-precise errors.

    A UTF-8 byte-order mark (spreadsheets write one) is skipped; a field over
    :data:`~hetsched.core.limits.MAX_CSV_FIELD` characters is refused by line.
    """
    reader = csv.DictReader(io.StringIO(text.removeprefix("\ufeff")))
    try:
        return _parse_rows(reader, source)
    except csv.Error as e:
        raise InputError(source, f"not a readable CSV: {e} (the limit for one field is "
                         f"{limits.MAX_CSV_FIELD // 1024} KiB)", f"line {reader.line_num}"
                         ) from None


def _parse_rows(reader: csv.DictReader[str], source: str) -> list[ProfileRow]:
    if reader.fieldnames is None:
        raise InputError(source, "empty file; expected a header line "
                         f"'{','.join(CSV_COLUMNS)}[,sync_time_s][,max_local_batch]'")
    header = [h.strip() for h in reader.fieldnames]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise InputError(source, f"missing column {missing[0]!r}; the header must contain "
                         f"{', '.join(CSV_COLUMNS)} (optional: {', '.join(OPTIONAL_COLUMNS)})",
                         "line 1")
    unknown = [c for c in header if c not in CSV_COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        raise InputError(source, f"unknown column {unknown[0]!r}; valid columns: "
                         f"{', '.join(CSV_COLUMNS + OPTIONAL_COLUMNS)}", "line 1")
    rows: list[ProfileRow] = []
    for raw in reader:
        if len(rows) >= limits.MAX_PROFILE_ROWS:
            raise InputError(source, f"more than {limits.MAX_PROFILE_ROWS} profile rows; "
                             "that is hetsched's limit", f"line {reader.line_num}")
        # the reader's own line count: DictReader skips blank lines, so counting rows
        # would name the wrong line after one
        where = f"line {reader.line_num}"
        if None in raw:  # DictReader files surplus fields under None; they were dropped silently
            raise InputError(source, f"{len(header) + len(raw[None])} fields, the header has "
                             f"{len(header)}", where)
        rec = {k.strip(): (v.strip() if isinstance(v, str) else v) for k, v in raw.items()
               if k is not None}

        def num(col: str, integer: bool = False, optional: bool = False,
                _rec: dict[str, str | None] = rec, _where: str = where,
                zero: bool = False) -> float | None:
            v = _rec.get(col)
            if v is None or v == "":
                if optional:
                    return None
                raise InputError(source, f"column {col!r} is empty", _where)
            try:
                x = float(v) if len(v) <= 64 else math.nan
            except ValueError:
                raise InputError(source, f"column {col!r}: {v[:60]!r} is not a number",
                                 _where) from None
            if not math.isfinite(x) or x < 0 or (x == 0 and not zero):
                raise InputError(source, f"column {col!r}: must be a "
                                 f"{'non-negative' if zero else 'positive'} number, got "
                                 f"{v[:60]!r}", _where)
            msg = limits.check_number(x, limits.PROFILE[col])
            if msg:
                raise InputError(source, f"column {col!r}: {msg}", _where)
            return x

        workload = rec.get("workload") or ""
        gpu_type = (rec.get("gpu_type") or "").lower()
        if not workload:
            raise InputError(source, "column 'workload' is empty", where)
        if not WORKLOAD_RE.match(workload):
            raise InputError(source, f"column 'workload': {workload[:60]!r} is not valid; expected "
                             f"{WORKLOAD_VALID}", where)
        if not re.match(r"^[A-Za-z0-9_-]+$", gpu_type):
            raise InputError(source, f"column 'gpu_type': {gpu_type[:60]!r} is not a GPU type name",
                             where)
        lb = num("local_batch", integer=True)
        st = num("step_time_s")
        assert lb is not None and st is not None
        sync = num("sync_time_s", optional=True)
        cap = num("max_local_batch", integer=True, optional=True)
        k = num("gpus", integer=True, optional=True)
        co = _colocated(rec.get("colocated_with") or "", source, where)
        opt = num("optimizer_s", optional=True, zero=True)
        if opt is not None and opt > st:
            raise InputError(source, f"column 'optimizer_s': {opt:g} s exceeds the step it is "
                             f"part of (step_time_s {st:g} s)", where)
        if co is not None and (k or 1) != 1:
            raise InputError(source, "column 'colocated_with': a co-located pair is measured "
                             "on one GPU; leave 'gpus' empty or 1", where)
        rows.append(ProfileRow(workload, gpu_type, int(lb), st, sync,
                               int(cap) if cap is not None else None,
                               int(k) if k is not None else 1, co, opt))
    if not rows:
        raise InputError(source, "no profile rows after the header")
    return rows


_COLOCATED = re.compile(r"^(?P<w>[A-Za-z0-9][A-Za-z0-9._-]*):(?P<b>[1-9][0-9]{0,8})$")


def _colocated(text: str, source: str, where: str) -> str | None:
    """The ``colocated_with`` column: empty, or ``workload:local_batch`` of the GPU's partner."""
    if not text:
        return None
    m = _COLOCATED.match(text)
    if not m or not WORKLOAD_RE.match(m["w"]):
        raise InputError(source, f"column 'colocated_with': {text[:60]!r} is not valid; expected "
                         "'workload:local_batch' of the job sharing the GPU, e.g. resnet-50:32",
                         where)
    return text


def load_throughputs(path: str | Path) -> ThroughputTable:
    """Load a throughput CSV file into a fitted table."""
    p = Path(path)
    text = read_text(p, "a CSV file", max_bytes=limits.MAX_CSV_BYTES)
    return ThroughputTable(parse_csv(text, str(p)), str(p))


def write_csv(rows: Iterable[ProfileRow], out: io.TextIOBase | io.StringIO) -> None:
    """Write profile rows in the CSV format the planner reads."""
    rows = list(rows)
    has_sync = any(r.sync_time_s is not None for r in rows)
    has_cap = any(r.max_local_batch is not None for r in rows)
    has_gpus = any(r.gpus != 1 for r in rows)
    has_co = any(r.colocated_with is not None for r in rows)
    has_opt = any(r.optimizer_s is not None for r in rows)
    cols = list(CSV_COLUMNS) + (["sync_time_s"] if has_sync else []) + (
        ["max_local_batch"] if has_cap else []) + (["gpus"] if has_gpus else []) + (
        ["colocated_with"] if has_co else []) + (["optimizer_s"] if has_opt else [])
    w = csv.writer(out, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        line: list[object] = [r.workload, r.gpu_type, r.local_batch, f"{r.step_time_s:.6g}"]
        if has_sync:
            line.append("" if r.sync_time_s is None else f"{r.sync_time_s:.6g}")
        if has_cap:
            line.append("" if r.max_local_batch is None else r.max_local_batch)
        if has_gpus:
            line.append(r.gpus)
        if has_co:
            line.append(r.colocated_with or "")
        if has_opt:
            line.append("" if r.optimizer_s is None else f"{r.optimizer_s:.6g}")
        w.writerow(line)


# ---------------------------------------------------------------------------
# Gavel import

_GAVEL_NAME = re.compile(r"^(?P<model>.+?) \(batch size (?P<bs>\d+)\)$")


def workload_key(model: str) -> str:
    """Gavel model name to a workload key usable in CSV and job specs: 'ResNet-18' -> 'resnet-18'."""
    return re.sub(r"[^a-z0-9_-]+", "-", model.lower()).strip("-")


def gavel_to_rows(data: dict[str, object], source: str) -> list[ProfileRow]:
    """Convert Gavel's throughput JSON (steps/s per job type and GPU) to profile rows.

    Isolated measurements are fitted: the ``null`` entry (no co-located job) of
    the consolidated GPU types, at every scale factor ``s`` (1, 2, 4, 8). The
    co-located pairs on one GPU are kept as ``colocated_with`` rows (Harmony's
    groups use them instead of the model where measured).
    Gavel's throughput at scale ``s`` is the aggregate over the ``s`` workers
    (per-worker steps per second summed; its trace generator multiplies it by
    the duration to get a trace's steps), so one synchronous iteration takes
    ``s / throughput`` seconds; that is the row's ``step_time_s`` with
    ``gpus = s`` and the per-worker ``local_batch``. Job types without a
    ``(batch size N)`` suffix (A3C, CycleGAN) have no batch to model and are
    skipped.
    """
    rows: list[ProfileRow] = []
    for gpu_type, jobs in sorted(data.items()):
        if gpu_type.endswith("_unconsolidated") or not isinstance(jobs, dict):
            continue
        for key, entry in jobs.items():
            try:
                name, scale = ast.literal_eval(key)
            except (ValueError, SyntaxError):
                raise InputError(source, f"unexpected job key {key!r}; expected "
                                 "\"('Model (batch size N)', scale)\"", gpu_type) from None
            m = _GAVEL_NAME.match(name)
            if not m or not isinstance(entry, dict) or entry.get("null") is None:
                continue
            its_per_s = float(entry["null"])
            if its_per_s <= 0:
                continue
            rows.append(ProfileRow(workload_key(m["model"]), gpu_type.lower(), int(m["bs"]),
                                   float(scale) / its_per_s, gpus=int(scale)))
            if int(scale) == 1:
                rows += _gavel_pairs(workload_key(m["model"]), gpu_type.lower(), int(m["bs"]),
                                     entry)
    if not rows:
        raise InputError(source, "no usable single-GPU measurements found")
    if not any(r.gpus == 1 for r in rows):
        raise InputError(source, "no usable single-GPU measurements found")
    rows.sort(key=lambda r: (r.workload, r.gpu_type, r.gpus, r.local_batch))
    return rows


def _gavel_pairs(workload: str, gpu_type: str, batch: int, entry: dict[str, object]
                 ) -> list[ProfileRow]:
    """Gavel's co-located pairs of one single-GPU job: its step time beside each partner.

    ``entry[partner] = [own steps/s, partner's steps/s]`` with both on one GPU;
    zeros (the pair did not fit or was not run) and partners without a batch
    size are skipped. The partner's own row comes from its own entry.
    """
    out = []
    for key, val in entry.items():
        if key == "null" or not isinstance(val, list) or len(val) != 2:
            continue
        try:
            other, scale = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            continue
        m = _GAVEL_NAME.match(str(other))
        own = float(val[0]) if isinstance(val[0], (int, float)) else 0.0
        if scale != 1 or not m or own <= 0:
            continue
        out.append(ProfileRow(workload, gpu_type, batch, 1.0 / own,
                              colocated_with=f"{workload_key(m['model'])}:{int(m['bs'])}"))
    return out


def load_gavel(path: str | Path) -> list[ProfileRow]:
    p = Path(path)
    text = read_text(p, "Gavel's throughput JSON")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(str(p), f"not a readable Gavel throughput JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError(str(p), "expected a JSON object keyed by GPU type")
    return gavel_to_rows(data, str(p))


def coverage_warnings(cluster_types: dict[str, int], table: ThroughputTable,
                      cluster_source: str = "cluster") -> list[str]:
    """One line per GPU type of the cluster that no profile row covers.

    The planner cannot estimate a step time there, so those GPUs stay idle; the
    user should know instead of wondering why (``hetsched plan`` prints these on
    stderr).
    """
    known = set(table.gpu_types)
    return [f"{cluster_source}: GPU type {t!r} ({n} GPUs) has no profiles in {table.source}; "
            f"its GPUs are left idle (profile it with `hetsched profile`, or add rows for it)"
            for t, n in sorted(cluster_types.items()) if t not in known]
