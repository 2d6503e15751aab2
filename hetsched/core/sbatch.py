"""How a job is submitted to Slurm: time limit, account, QoS, memory, CPUs per GPU,
constraint, extras.

A job spec may carry a ``slurm:`` mapping, a jobs file a top-level ``slurm:``
default, ``hetsched submit`` options and the config file their own; they are
merged by :meth:`SbatchOptions.over` (see docs/slurm.md, "Sbatch options").
Every value is validated here, so what reaches an ``#SBATCH`` line is one word
that sbatch parses itself: no whitespace, no quotes, no shell characters that
could start a command (``$``, backticks, ``;``, ``#``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

#: Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
TIME_RE = re.compile(r"^(\d{1,7})(-\d{1,2})?(:\d{1,2}){0,2}$")
NAME_VALUE_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MEM_RE = re.compile(r"^\d{1,12}[KMGT]?$")
#: a constraint expression (``a100&ib``, ``[rack1|rack2]``, ``gpu*2``)
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9._&|\[\]*():!,-]{1,256}$")
#: one extra sbatch option: ``--exclusive``, ``--mail-type=END``
EXTRA_RE = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9._:/=,%+@&|\[\]*()!-]{1,256})?$")
#: options hetsched sets itself: an extra may not override them
RESERVED = frozenset({
    "job-name", "gres", "gpus", "gpus-per-node", "gpus-per-task", "nodelist", "ntasks",
    "nodes", "comment", "output", "error", "open-mode", "dependency", "wrap", "array",
    "requeue", "no-requeue", "signal", "hold", "partition", "parsable", "wait",
    "test-only", "het-group", "cpus-per-task", "cpus-per-gpu", "time", "account", "qos",
    "mem", "constraint", "chdir", "export",
})
KEYS = ("time", "account", "qos", "mem", "cpus_per_gpu", "constraint", "extra")
#: an extra option -> the key that sets it
KEY_OF = {"cpus-per-task": "cpus_per_gpu", "cpus-per-gpu": "cpus_per_gpu"}
MAX_CPUS_PER_GPU = 1024


class SbatchOptionError(ValueError):
    """A value that cannot be an sbatch option; the message says what is valid."""

    def __init__(self, key: str, msg: str) -> None:
        self.key = key
        super().__init__(msg)


def time_minutes(text: str) -> int:
    """Slurm's time string in whole minutes (rounded up)."""
    days, _, rest = text.rpartition("-") if "-" in text else ("", "", text)
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        secs = int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif len(parts) == 1:  # minutes
        secs = parts[0] * 60
    elif len(parts) == 2:  # MM:SS
        secs = parts[0] * 60 + parts[1]
    else:  # HH:MM:SS
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return -(-secs // 60)


def _check(key: str, value: Any) -> Any:
    if key == "extra":
        items = value.split() if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
            raise SbatchOptionError(key, "expected a list of options like '--exclusive'")
        for x in items:
            if not EXTRA_RE.match(x):
                raise SbatchOptionError(key, f"{x[:60]!r} is not one sbatch option; write "
                                        "'--name' or '--name=value' (no spaces or quotes)")
            name = x[2:].split("=", 1)[0]
            if name in RESERVED:
                use = name if name in KEYS else KEY_OF.get(name)
                raise SbatchOptionError(key, f"{x[:60]!r}: hetsched sets --{name} itself"
                                        + (f"; use the '{use}' key" if use else ""))
        return tuple(items)
    if key == "cpus_per_gpu":  # each one-GPU task's --cpus-per-task
        n = value if isinstance(value, int) and not isinstance(value, bool) else (
            int(value) if isinstance(value, str) and value.isdigit() else None)
        if n is None or not 1 <= n <= MAX_CPUS_PER_GPU:
            raise SbatchOptionError(key, f"{str(value)[:60]!r} is not valid; expected a whole "
                                    f"number of CPU cores from 1 to {MAX_CPUS_PER_GPU}")
        return n
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise SbatchOptionError(key, f"expected a string, got {type(value).__name__}")
    s = str(value)
    pattern, valid = {
        "time": (TIME_RE, "minutes, MM:SS, HH:MM:SS or D-HH:MM:SS"),
        "account": (NAME_VALUE_RE, "ASCII letters, digits, '.', '_' or '-'"),
        "qos": (NAME_VALUE_RE, "ASCII letters, digits, '.', '_' or '-'"),
        "mem": (MEM_RE, "a number with an optional K/M/G/T suffix, e.g. 64G"),
        "constraint": (CONSTRAINT_RE, "a Slurm constraint such as 'a100&ib' (no spaces)"),
    }[key]
    if not pattern.match(s):
        raise SbatchOptionError(key, f"{s[:60]!r} is not valid; expected {valid}")
    if key == "time" and time_minutes(s) < 1:
        raise SbatchOptionError(key, "a time limit must be at least one minute")
    return s


@dataclass(frozen=True)
class SbatchOptions:
    """Sbatch options for a job; None = not set at this level."""

    time: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = None
    #: CPU cores for each GPU (each rank is a one-GPU task: its --cpus-per-task); 1 if unset
    cpus_per_gpu: int | None = None
    constraint: str | None = None
    extra: tuple[str, ...] = ()

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> SbatchOptions:
        """Validate a ``slurm:`` mapping (raises SbatchOptionError naming the key)."""
        unknown = sorted(set(map(str, data)) - set(KEYS))
        if unknown:
            raise SbatchOptionError(unknown[0], f"unknown sbatch key {unknown[0]!r}; valid: "
                                    f"{', '.join(KEYS)}")
        return cls(**{k: _check(k, v) for k, v in data.items() if v is not None})

    def over(self, base: SbatchOptions | None) -> SbatchOptions:
        """These options, with ``base`` filling what is unset (extras: base's first)."""
        if base is None:
            return self
        vals = {f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                else getattr(base, f.name) for f in fields(self) if f.name != "extra"}
        extra = tuple(dict.fromkeys(base.extra + self.extra))
        return replace(self, **vals, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)
                             if f.name != "extra" and getattr(self, f.name) is not None}
        if self.extra:
            d["extra"] = list(self.extra)
        return d

    def __bool__(self) -> bool:
        return bool(self.to_dict())
