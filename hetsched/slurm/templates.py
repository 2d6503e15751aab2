"""Render the sbatch scripts in ``job_templates/`` (Jinja2).

Autoescaping is off (this is a shell script, not HTML), so safety comes from
filters, and it is *enforced*: every ``{{ value }}`` must pass through one of

* ``name``  – validated against ``[A-Za-z0-9._-]+`` (job, node, GPU type, ...);
* ``word``  – validated, no whitespace, quotes or shell metacharacters (values
  composed from names, used in ``#SBATCH`` lines, which sbatch parses itself);
* ``opt``   – an sbatch option value or ``--option[=value]``: like ``word`` but
  also ``&|[]*()!`` (constraint expressions), never whitespace, quotes, ``$``,
  backticks, ``;`` or ``#``;
* ``int``   – a validated non-negative integer;
* ``q``     – ``shlex.quote`` of a string without control characters
  (commands, paths, workload names).

No value may appear in a ``#`` comment line: a rendered script's comment
lines must be literal lines of its template (``_check_structure``), so a
template edit that puts a value in a comment fails at render time too.

Each filter returns a marker type; the environment's ``finalize`` refuses to
emit anything else, so a template edit that forgets a filter fails loudly
instead of writing an unquoted value into a script.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2

from hetsched import config
from hetsched.core.plan import JobPlan, Worker, worker_groups
from hetsched.core.sbatch import SbatchOptions
from hetsched.errors import InputError
from hetsched.io.jobfiles import JobFiles, root_of_plan_copy
from hetsched.slurm.client import UNTYPED

NAME_RE = re.compile(r"^[A-Za-z0-9._-]+$")
WORD_RE = re.compile(r"^[A-Za-z0-9._:/=,%+@-]+$")
OPT_RE = re.compile(r"^[A-Za-z0-9._:/=,%+@&|\[\]*()!-]+$")


class TemplateValueError(InputError):
    """A value cannot be placed in a script safely (bad name, unquoted value)."""


class _Safe(str):
    """A string a filter has validated or quoted."""


def _name(v: Any) -> _Safe:
    s = str(v)
    if not NAME_RE.match(s):
        raise TemplateValueError("sbatch template", f"{s!r} is not a valid name; use letters, "
                                 "digits, '.', '_' or '-'")
    return _Safe(s)


def _word(v: Any) -> _Safe:
    s = str(v)
    if not WORD_RE.match(s):
        raise TemplateValueError("sbatch template", f"{s!r} contains spaces or shell "
                                 "characters; only ASCII letters, digits and ._:/=,%+@- are allowed "
                                 "here (paths for logs/state must not contain spaces)")
    return _Safe(s)


def _opt(v: Any) -> _Safe:
    s = str(v)
    if not OPT_RE.match(s):
        raise TemplateValueError("sbatch template", f"{s[:60]!r} is not a valid sbatch option "
                                 "value: no spaces, quotes or shell characters")
    return _Safe(s)


def _int(v: Any) -> _Safe:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TemplateValueError("sbatch template", f"{v!r} is not a non-negative integer")
    return _Safe(str(v))


_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _q(v: Any) -> _Safe:
    s = str(v)
    if _CONTROL_RE.search(s):
        raise TemplateValueError("sbatch template", f"{s[:40]!r} contains a newline or another "
                                 "control character; a script argument cannot hold one")
    return _Safe(shlex.quote(s))


def _finalize(v: Any) -> Any:
    if isinstance(v, _Safe):
        return v
    if v is None or v == "":  # empty output of a skipped branch
        return ""
    raise TemplateValueError("sbatch template", f"value {str(v)[:40]!r} reached the script "
                             "without a name/word/int/q filter")


def package_data(name: str) -> Path:
    """A directory shipped inside the package (``job_templates``, ``plugins``).

    In the source tree these are links to the top-level ``job_templates/`` and
    ``slurm_plugins/``; a wheel carries the files themselves.
    """
    return Path(str(resources.files("hetsched.slurm") / name))


def templates_dir() -> Path:
    """``$HETSCHED_TEMPLATES``, else the templates shipped with the package."""
    env = config.get("templates")
    if env:
        return Path(env)
    return package_data("job_templates")


def environment(directory: Path | None = None) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory or templates_dir())),
        autoescape=False,  # shell, not HTML: the filters do the quoting
        undefined=jinja2.StrictUndefined, finalize=_finalize, keep_trailing_newline=True,
    )
    env.filters.update({"name": _name, "word": _word, "int": _int, "q": _q, "opt": _opt})
    return env


def _literal_comments(source: str) -> set[str]:
    """The comment lines a template writes verbatim (not ``#SBATCH``, no ``{{ }}``)."""
    return {line.strip() for line in source.splitlines()
            if line.strip().startswith("#") and not line.strip().startswith("#SBATCH")
            and "{{" not in line and "{%" not in line and "{#" not in line}


def _render(name: str, directory: Path | None, ctx: Mapping[str, Any]) -> str:
    """Render template ``name`` and check its shape: values never open a line or a comment."""
    env = environment(directory)
    text = env.get_template(name).render(**ctx)
    assert env.loader is not None
    source = env.loader.get_source(env, name)[0]
    allowed = _literal_comments(source)
    for line in text.splitlines()[1:]:  # line 0 is the shebang
        s = line.strip()
        if s.startswith("#") and not s.startswith("#SBATCH ") and s not in allowed:
            raise TemplateValueError("sbatch template", f"{name}: rendered comment line "
                                     f"{s[:60]!r} is not a literal line of the template; "
                                     "values must never be placed in comments")
    return text


def hetsched_executable() -> str:
    """The ``hetsched`` command job steps run, as an absolute path where one is known.

    ``$HETSCHED_EXECUTABLE`` (the testbed, demos and tests run a stand-in);
    else the ``hetsched`` running now (``sys.argv[0]``), else the console
    script beside this Python (``python -m hetsched`` in a virtual
    environment), else the one on PATH. The running one comes before PATH: a
    batch job gets the submitter's PATH, and ``hetsched replan`` from cron has
    cron's (``/usr/bin:/bin``), where a bare ``hetsched`` in the script is not
    found on the compute node; PATH may also hold another install.
    """
    override = config.get("executable")
    if override:
        return str(override)
    for cand in (Path(sys.argv[0]) if sys.argv and sys.argv[0] else None,
                 Path(sys.executable).parent / "hetsched" if sys.executable else None):
        if cand is not None and cand.name == "hetsched" and cand.is_file() \
                and os.access(cand, os.X_OK):
            return os.path.abspath(cand)
    return shutil.which("hetsched") or "hetsched"


@dataclass(frozen=True)
class Component:
    """One hetjob component: the workers of one (GPU type, node) group."""

    gpu_type: str
    node: str
    gpus: int
    local_batches: tuple[int, ...]

    @property
    def tasks(self) -> int:
        return self.gpus


def gres_type(gpu_type: str, gres_names: Mapping[str, str] | None) -> str:
    """``gpu_type`` as a GRES request spells it: Slurm's spelling; "" for GPUs Slurm
    gives no type (hetsched calls them ``gpu``; the request is then ``gpu:N``)."""
    names = gres_names or {}
    if gpu_type in names:
        return names[gpu_type]
    return "" if gpu_type == UNTYPED else gpu_type


def component_fields(comps: Sequence[Component], pin_nodes: bool,
                     gres_names: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The template fields of each component. ``gres_type`` is the GPU type as Slurm
    spells it (``gres_names``: GRES types are case-sensitive, hetsched's names are
    lower case), for a typed ``--gres=gpu:TYPE:N``."""
    return [{"gpu_type": c.gpu_type, "gres_type": gres_type(c.gpu_type, gres_names),
             "node": c.node if pin_nodes else "", "gpus": c.gpus, "tasks": c.tasks}
            for c in comps]


def components(workers: Sequence[Worker | Mapping[str, Any]]) -> list[Component]:
    """One hetjob component per (GPU type, node) group of a segment's workers.

    The grouping and the rank order it implies are the plan contract's
    (:func:`hetsched.core.plan.worker_groups`), shared with the runtime.
    """
    return [Component(t, n, len(b), b) for t, n, b in worker_groups(workers)]


@dataclass(frozen=True)
class Script:
    """A rendered script and what it asks for."""

    text: str
    components: list[Component]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def submission_comment(plan_id: str, job: str, segment: int) -> str:
    """The tag in ``--comment`` that identifies a hetsched submission in Slurm."""
    return f"hetsched:{plan_id}:{job}:{segment}"



def sbatch_fields(sbatch: Any, time_min: Any) -> dict[str, Any]:
    """The template fields of the user's sbatch options (one place for every template).

    ``sbatch.time`` wins over the time limit hetsched derives (``time_min``).
    """
    return {
        "time": (sbatch.time if sbatch and sbatch.time else (time_min or "")),
        "account": (sbatch.account if sbatch else None) or "",
        "qos": (sbatch.qos if sbatch else None) or "",
        "mem": (sbatch.mem if sbatch else None) or "",
        # 0: not said, so the partition's DefCpuPerGPU (else Slurm's one per task) applies
        "cpus": (sbatch.cpus_per_gpu if sbatch else None) or 0,
        "constraint": (sbatch.constraint if sbatch else None) or "",
        "extra": list(sbatch.extra) if sbatch else [],
    }


def render_hetjob(plan_id: str, job: JobPlan, segment: int = 0, *,
                  plan_path: str | Path, log_dir: str | Path, partition: str | None = None,
                  pin_nodes: bool = True, hetsched: str | None = None,
                  directory: Path | None = None, sbatch: SbatchOptions | None = None,
                  time_min: int = 0, signal_s: int = 0,
                  layout_path: str | Path | None = None,
                  gres_names: Mapping[str, str] | None = None) -> Script:
    """The hetjob script for segment ``segment`` of one job of a plan.

    The rank layout is not in the script: ``hetsched run`` reads it from
    ``layout_path`` (io/layout.py; default: ``JobFiles.layout`` beside a ``plan_path``
    that is ``io.jobfiles.plan_copy``), so a replan
    can change the pending job in place (``scontrol update`` of GRES, node list
    and task count, then the layout file). Pinned components ask for untyped
    GPUs on their node (``--gres=gpu:N --nodelist=NODE``; one GPU type per
    node): Slurm 22.05 leaves a pending job whose GRES *type* was updated never
    runnable (BadConstraints), while the node list of an untyped request can
    move it to another type's node. Unpinned ones (``pin_nodes=False``) ask
    for ``gpu:TYPE:N``, TYPE spelled as Slurm does (``gres_names``).

    ``sbatch`` adds account/QoS/memory/constraint/extra options to every
    component; ``time_min`` is the time limit (``sbatch.time`` wins);
    ``signal_s`` > 0 asks Slurm for SIGUSR1 that many seconds before the limit,
    which the script turns into checkpoint-and-requeue. The plan's order
    (``--dependency``) is given on sbatch's command line (app/order.py): it
    names Slurm ids that exist only once the earlier jobs are submitted.
    """
    if segment >= len(job.segments):
        raise TemplateValueError("plan", f"job {job.name!r} has no segment {segment}")
    workers = job.segments[segment].workers
    if not workers:
        raise TemplateValueError("plan", f"job {job.name!r} segment {segment} has no workers")
    comps = components(workers)
    for c in comps:  # a pinned component's type is not written (untyped GRES): check it
        _name(c.gpu_type)
    spec = job.spec
    command = shlex.join(spec.command) if spec is not None and spec.command else ""
    if layout_path is None:  # submit's, beside the plan copy (io/jobfiles.py)
        layout_path = JobFiles(root_of_plan_copy(plan_path), _name(plan_id), _name(job.name),
                               segment).layout
    ctx = {
        "plan_id": plan_id, "job": job.name, "segment": segment,
        "components": component_fields(comps, pin_nodes, gres_names),
        "partition": partition or "",
        "comment": submission_comment(plan_id, job.name, segment),
        "log_dir": str(log_dir),
        "workload": spec.workload if spec is not None else "",
        "command": command,
        "entrypoint": (spec.entrypoint or "") if spec is not None else "",
        "hetsched": hetsched or hetsched_executable(),
        "plan_path": str(plan_path),
        "layout_path": str(layout_path),
        **sbatch_fields(sbatch, time_min),
        "signal_s": signal_s,
    }
    text = _render("hetjob.sbatch.j2", directory, ctx)
    return Script(text, comps)


def render_probe(workload: str, gpu_type: str, batches: Sequence[int], *, out: str | Path,
                 log_dir: str | Path, partition: str | None = None, node: str | None = None,
                 extra_args: Sequence[str] = (), hetsched: str | None = None,
                 directory: Path | None = None, time_min: int | None = None,
                 gres_names: Mapping[str, str] | None = None, cpus: int = 0) -> Script:
    """A probe job: one GPU of ``gpu_type`` runs ``hetsched probe`` for ``workload``.

    ``time_min`` is Slurm's time limit (minutes): a probe that hangs is killed.
    ``gres_names``: each GPU type as Slurm spells it (:func:`gres_type`); ``cpus``
    the CPU cores the probe's one GPU gets (``cpus_per_gpu``: as the jobs will; 0, not
    said: the partition's default, as for the jobs).
    """
    safe_w = re.sub(r"[^A-Za-z0-9._-]", "_", workload)[:40] or "w"
    ctx = {
        "job_name": f"hetsched-probe-{safe_w}-{gpu_type}", "workload": workload,
        "gpu_type": gpu_type,
        "gres_type": gres_type(gpu_type, gres_names),
        "partition": partition or "", "node": node or "",
        "comment": f"hetsched:probe:{safe_w}:{gpu_type}", "log_dir": str(log_dir),
        "batches": ",".join(str(int(b)) for b in batches), "out": str(out),
        "extra_args": [str(a) for a in extra_args],
        "hetsched": hetsched or hetsched_executable(),
        "time_min": time_min or 0,
        "cpus": cpus,
    }
    text = _render("probe.sbatch.j2", directory, ctx)
    return Script(text, [Component(gpu_type, node or "", 1, (max(batches, default=1),))])
