"""Every setting hetsched reads, once: name, environment variable, default, meaning.

Precedence, highest first: a command-line option (the CLI passes it in), the
environment (``HETSCHED_*``), the user's config file
(``$XDG_CONFIG_HOME/hetsched/config.toml``, else ``~/.config/hetsched/config.toml``),
the site's (``/etc/hetsched/config.toml``, or ``$HETSCHED_SITE_CONFIG``), the
default here. ``hetsched config show`` prints each effective value and where it
came from. The rest of the code asks :func:`get` (or the named helpers below)
and never reads ``os.environ`` for a ``HETSCHED_*`` setting itself.

The in-job variables that an sbatch script sets for ``hetsched run``
(``HETSCHED_LOCAL_BATCHES`` and friends, :data:`JOB_ENV`) are a protocol
between the templates and the runtime, not settings: they are listed here so
both sides name them from one place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetsched.errors import InputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class Setting:
    """One setting: its key in config files, its variable, its default and meaning."""

    key: str
    env: str
    default: Any
    help: str
    kind: type = str
    #: the values a string setting may take (empty: any)
    choices: tuple[str, ...] = ()


#: restart cost (s) a plan charges when a running job changes GPUs: checkpoint,
#: requeue and reload (the HAS paper measures tens of seconds)
DEFAULT_RESTART_COST_S = 60.0

SETTINGS: dict[str, Setting] = {s.key: s for s in (
    Setting("state", "HETSCHED_STATE", "",
            "SQLite state store (default $XDG_STATE_HOME/hetsched/state.db)"),
    Setting("state_journal", "HETSCHED_STATE_JOURNAL", "auto",
            "the state file's SQLite journal: auto (WAL on a local file system, a rollback "
            "journal on a network one such as NFS, Lustre or GPFS), wal or delete",
            choices=("auto", "wal", "delete")),
    Setting("partition", "HETSCHED_PARTITION", "", "Slurm partition to plan for and submit to"),
    Setting("restart_cost_s", "HETSCHED_RESTART_COST", DEFAULT_RESTART_COST_S,
            "seconds a plan charges when a running job changes GPUs", float),
    Setting("templates", "HETSCHED_TEMPLATES", "",
            "directory of sbatch templates (default: those shipped with hetsched)"),
    Setting("executable", "HETSCHED_EXECUTABLE", "",
            "the hetsched command job steps run (default: hetsched on PATH)"),
    Setting("checkpoint_dir", "HETSCHED_CHECKPOINT_DIR", "",
            "where jobs write checkpoints, one folder per batch "
            "(default: <state>.files/checkpoints)"),
    Setting("report_dir", "HETSCHED_REPORT_DIR", "",
            "where jobs write reports, one folder per batch (default: <state>.files/reports)"),
    Setting("report_every", "HETSCHED_REPORT_EVERY", 10,
            "steps between a training rank's 'steps' report records (1: every step)", int),
    Setting("testbed", "HETSCHED_TESTBED", "", "directory of the local test Slurm"),
    Setting("spool", "HETSCHED_SPOOL", "", "spool directory of the local test Slurm"),
    Setting("master_addr", "HETSCHED_MASTER_ADDR", "",
            "rendezvous address of a job's ranks (default: the first node)"),
    Setting("master_port", "HETSCHED_MASTER_PORT", "",
            "rendezvous port (default: derived from the job and step id)"),
    Setting("plan_budget_s", "HETSCHED_PLAN_BUDGET", 20.0,
            "work auto may spend, in reference seconds of counted work (never a clock): "
            "a candidate predicted to need more is skipped", float),
    Setting("plan_workers", "HETSCHED_PLAN_WORKERS", 0,
            "processes auto runs candidates in on large problems, and pool mode its space "
            "seed beside Hare (0 = one per core; 1: all in one process)", int),
    Setting("replan_online", "HETSCHED_REPLAN_ONLINE", False,
            "true (or 1, yes, on): replan decides online: a started job stays on its GPUs "
            "until it ends, only waiting and new jobs are placed", bool),
    Setting("emulate_speed", "HETSCHED_EMULATE_SPEED", "",
            "test only: emulated GPU speeds, e.g. 'a100=1,t4=0.5'"),
    Setting("emulate_cost", "HETSCHED_EMULATE_COST", "",
            "test only: emulated per-sample cost in seconds"),
    Setting("emulate_link", "HETSCHED_EMULATE_LINK", "",
            "test only: emulated slow link, 'A,C': every all-reduce takes at least "
            "A seconds + C seconds per MiB of gradients"),
    # how jobs are submitted (docs/slurm.md, "Sbatch options"): the site's defaults,
    # below a job's own `slurm:` keys, the jobs file's and `hetsched submit`'s options
    Setting("sbatch_time", "HETSCHED_SBATCH_TIME", "",
            "time limit for every job (default: from its predicted duration)"),
    Setting("sbatch_account", "HETSCHED_SBATCH_ACCOUNT", "", "Slurm account (--account)"),
    Setting("sbatch_qos", "HETSCHED_SBATCH_QOS", "", "Slurm QoS (--qos)"),
    Setting("sbatch_mem", "HETSCHED_SBATCH_MEM", "", "memory per node (--mem), e.g. 64G"),
    Setting("sbatch_cpus_per_gpu", "HETSCHED_SBATCH_CPUS_PER_GPU", "",
            "CPU cores for each GPU (--cpus-per-task of each one-GPU task; default: the "
            "partition's DefCpuPerGPU, else one)"),
    Setting("sbatch_constraint", "HETSCHED_SBATCH_CONSTRAINT", "",
            "node features (--constraint)"),
    Setting("sbatch_extra", "HETSCHED_SBATCH_EXTRA", "",
            "extra sbatch options, space-separated, e.g. '--exclusive --mail-type=END'"),
    Setting("time_margin", "HETSCHED_TIME_MARGIN", 1.5,
            "time limit = predicted duration x this + time_pad_s", float),
    Setting("time_pad_s", "HETSCHED_TIME_PAD", 600.0,
            "seconds added to a job's predicted duration for its time limit", float),
    Setting("signal_s", "HETSCHED_SIGNAL_S", 300.0,
            "SIGUSR1 this many seconds before the time limit: checkpoint and requeue "
            "(0: off)", float),
)}

#: variables an sbatch script exports for ``hetsched run`` (set by templates, read by runtime)
JOB_ENV = ("HETSCHED_PLAN_ID", "HETSCHED_JOB", "HETSCHED_SEGMENT", "HETSCHED_WORKLOAD",
           "HETSCHED_GLOBAL_BATCH", "HETSCHED_LOCAL_BATCHES", "HETSCHED_LOCAL_BATCH",
           "HETSCHED_GPU_TYPES", "HETSCHED_RANK_NODES", "HETSCHED_RANK", "HETSCHED_COMMAND",
           "HETSCHED_ENTRYPOINT", "HETSCHED_POOL_GPUS", "HETSCHED_LAYOUT")


def site_config_path() -> Path:
    return Path(os.environ.get("HETSCHED_SITE_CONFIG") or "/etc/hetsched/config.toml")


def user_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hetsched" / "config.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise InputError(str(path), f"cannot read config file: {e.strerror or e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(str(path), f"not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(SETTINGS))
    if unknown:
        raise InputError(str(path), f"unknown setting {unknown[0]!r}; valid: "
                         f"{', '.join(SETTINGS)}")
    return data


#: what a yes/no setting reads as true or false (a TOML boolean, or these words)
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _convert(s: Setting, raw: Any, source: str) -> Any:
    if s.kind is bool:
        word = str(raw).strip().lower()
        if isinstance(raw, bool) or word in TRUE_WORDS + FALSE_WORDS:
            return raw if isinstance(raw, bool) else word in TRUE_WORDS
        raise InputError(source, f"{raw!r} is not valid; expected true or false (or "
                         "1/0, yes/no, on/off)", s.key)
    if s.kind is int:
        try:
            v = float(raw) if not isinstance(raw, bool) else -1.0
        except (TypeError, ValueError):
            v = -1.0
        if not (0 <= v < 1e9 and v == int(v)):
            raise InputError(source, f"{raw!r} is not valid; expected a whole number >= 0",
                             s.key)
        return int(v)
    if s.kind is float:
        try:
            v = float(raw)
        except (TypeError, ValueError):
            raise InputError(source, f"{raw!r} is not a number", s.key) from None
        if not v >= 0 or v == float("inf"):
            raise InputError(source, f"{raw!r} must be a finite number >= 0", s.key)
        return v
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise InputError(source, f"expected a string, got {type(raw).__name__}", s.key)
    if s.choices and str(raw) not in s.choices:
        raise InputError(source, f"{raw!r} is not valid; expected {', '.join(s.choices)}", s.key)
    return str(raw)


def resolve(key: str, env: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """The effective value of setting ``key`` and where it came from."""
    s = SETTINGS[key]
    env = os.environ if env is None else env
    if env.get(s.env):
        return _convert(s, env[s.env], f"${s.env}"), f"environment ${s.env}"
    for label, path in (("user", user_config_path()), ("site", site_config_path())):
        data = _read_toml(path)
        if key in data:
            return _convert(s, data[key], str(path)), f"{label} config {path}"
    return s.default, "default"


def get(key: str) -> Any:
    """The effective value of setting ``key`` (CLI options are applied by the CLI)."""
    return resolve(key)[0]


def show(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every setting with its effective value and origin (``hetsched config show``)."""
    rows = []
    for key, s in SETTINGS.items():
        value, origin = resolve(key, env)
        if key == "state" and not value:  # the file every command uses: say which
            value = str(default_state_path(env))
        rows.append({"key": key, "value": value, "origin": origin, "env": s.env,
                     "help": s.help})
    return rows


def state_path() -> Path:
    """The state store: setting ``state``, else ``$XDG_STATE_HOME/hetsched/state.db``."""
    v = get("state")
    return Path(v).expanduser() if v else default_state_path()


def default_state_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/hetsched/state.db`` (``~/.local/state`` when that is unset)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "hetsched" / "state.db"


def sbatch_defaults() -> dict[str, Any]:
    """The config's sbatch options as a ``slurm:`` mapping (unset ones left out).

    One ``sbatch_KEY`` setting per key of a jobs file's ``slurm:`` (``core.sbatch.KEYS``;
    tests/test_config.py keeps the two in step).
    """
    out: dict[str, Any] = {}
    for name in SETTINGS:
        key = name.removeprefix("sbatch_")
        if key != name and (v := get(name)):
            out[key] = v.split() if key == "extra" else v
    return out

