"""The environment sbatch runs in: the job script decides, not the caller's shell.

sbatch copies the caller's environment into the job (``SLURM_*`` variables
always, whatever ``--export`` says), and it reads ``SBATCH_*`` variables as
options that override the script's ``#SBATCH`` lines. Two ways that breaks a
job hetsched submits:

* **hetsched inside a Slurm job** (``watch`` or ``replan`` run as a job, where a
  site forbids long processes on its login nodes; ``profile`` or ``submit``
  from an interactive allocation). The enclosing job's ``SLURM_MEM_PER_CPU``,
  ``SLURM_CPUS_PER_TASK``, ``SLURM_TRES_PER_TASK``, ``SLURM_NTASKS``... reach the
  new job, whose ``srun`` reads them as its own options: with ``--mem`` set it
  dies at once ("srun: fatal: SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and
  SLURM_MEM_PER_NODE are mutually exclusive").
* **``SBATCH_*`` in a login shell's profile**: ``SBATCH_PARTITION``,
  ``SBATCH_OUTPUT``, ``SBATCH_TIMELIMIT``... silently replace what the plan and
  hetsched's settings put in the script (the partition the planned nodes are
  in, the log ``status`` points at, the time limit the requeue signal is timed
  against).

So sbatch gets the caller's environment less (1) every ``SLURM_*`` / ``SLURMD_*``
variable but the few that are a user's own input (:data:`SLURM_INPUTS`:
``SLURM_CONF`` and the like), and (2) every ``SBATCH_*`` variable that would
override an option the script sets (:data:`OPTION_VARIABLES`), or that would
change what a submission is (:data:`NEVER`: ``--wait`` would block the
submit, ``--array`` would submit copies, ``--exclusive`` would keep the jobs
a plan packs onto one node from sharing it). The caller is told once per
variable what was not passed on and which hetsched setting to use instead.
``SBATCH_*`` variables for options the script leaves out (``SBATCH_ACCOUNT``
with no ``sbatch_account`` setting, ``SBATCH_RESERVATION``...) still apply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: ``SLURM_*`` variables a user sets for the Slurm commands themselves (sbatch's
#: "input environment variables"); every other ``SLURM_*`` is a job's or a step's
SLURM_INPUTS = frozenset({
    "SLURM_CONF", "SLURM_CLUSTERS", "SLURM_DEBUG_FLAGS", "SLURM_EXIT_ERROR",
    "SLURM_EXIT_IMMEDIATE", "SLURM_HINT", "SLURM_TIME_FORMAT", "SLURM_UMASK",
})

#: a script option -> the ``SBATCH_*`` variables that would override or contradict it
OPTION_VARIABLES: dict[str, tuple[str, ...]] = {
    "job-name": ("SBATCH_JOB_NAME",),
    "partition": ("SBATCH_PARTITION",),
    "gres": ("SBATCH_GRES", "SBATCH_GPUS", "SBATCH_GPUS_PER_NODE", "SBATCH_GPUS_PER_TASK"),
    "cpus-per-task": ("SBATCH_CPUS_PER_TASK", "SBATCH_CPUS_PER_GPU"),
    "time": ("SBATCH_TIMELIMIT",),
    "account": ("SBATCH_ACCOUNT",),
    "qos": ("SBATCH_QOS",),
    "mem": ("SBATCH_MEM_PER_NODE", "SBATCH_MEM_PER_CPU", "SBATCH_MEM_PER_GPU"),
    "constraint": ("SBATCH_CONSTRAINT",),
    "output": ("SBATCH_OUTPUT", "SBATCH_ERROR"),
    "open-mode": ("SBATCH_OPEN_MODE",),
    "requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"),
    "no-requeue": ("SBATCH_REQUEUE", "SBATCH_NO_REQUEUE"),
    "signal": ("SBATCH_SIGNAL",),
}

#: ``SBATCH_*`` variables never passed on, whatever the script says, and why
NEVER: dict[str, str] = {
    "SBATCH_WAIT": "it would make sbatch wait for the job to end",
    "SBATCH_ARRAY_INX": "it would submit an array of copies of one planned job",
    "SBATCH_EXCLUSIVE": "a plan packs jobs onto shared nodes",
}

#: where a script option comes from, for the advice (options not listed: the plan)
SETTING_OF = {
    "partition": "HETSCHED_PARTITION",
    "time": "HETSCHED_SBATCH_TIME",
    "account": "HETSCHED_SBATCH_ACCOUNT",
    "qos": "HETSCHED_SBATCH_QOS",
    "mem": "HETSCHED_SBATCH_MEM",
    "cpus-per-task": "HETSCHED_SBATCH_CPUS_PER_GPU",
    "constraint": "HETSCHED_SBATCH_CONSTRAINT",
}

_OPTION = re.compile(r"^#SBATCH\s+--([a-z][a-z-]*)", re.MULTILINE)


def script_options(script: str) -> set[str]:
    """The long options of a script's ``#SBATCH`` lines (every component of a hetjob)."""
    return set(_OPTION.findall(script))


def sbatch_environment(environ: Mapping[str, str], script: str
                       ) -> tuple[dict[str, str], dict[str, str]]:
    """``(the environment to run sbatch in, {variable left out: why})`` for ``script``.

    Only ``SBATCH_*`` variables the caller set appear in the second dict (they
    were the caller's choice, so the caller is told); an enclosing job's
    ``SLURM_*`` variables are left out without a word.
    """
    options = script_options(script)
    overridden: dict[str, str] = {}
    for opt in sorted(options):
        for var in OPTION_VARIABLES.get(opt, ()):
            overridden.setdefault(var, opt)
    env: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith(("SLURM_", "SLURMD_")) and key not in SLURM_INPUTS:
            continue
        if key in NEVER:
            left_out[key] = NEVER[key]
            continue
        if key in overridden:
            opt = overridden[key]
            setting = SETTING_OF.get(opt)
            left_out[key] = (f"it would override the job script's --{opt}" + (
                f" (set {setting} to choose it)" if setting else " (hetsched sets it)"))
            continue
        env[key] = value
    return env, left_out


def enclosing_job(environ: Mapping[str, str]) -> str | None:
    """The id of the Slurm job this process runs in, if any."""
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or None
