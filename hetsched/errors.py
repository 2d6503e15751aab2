"""Errors that reach the user as one clear line.

Every error caused by bad input names where it came from (a file, a job, a
field) and what would have been valid. The CLI prints ``str(err)`` and exits
with code 2; nothing below the CLI prints or exits.
"""

from __future__ import annotations

# Exit codes, the one table (docs/reliability.md lists them for users). Errors
# set ``exit_code`` from here; the CLI exits with it.
EXIT_OK = 0
EXIT_FAILURE = 1  #: a run failed (a rank died, a command found nothing to do when asked to)
EXIT_INPUT = 2  #: bad input: a file, a field, a flag (InputError, PlanningError)
EXIT_COMMAND = 3  #: an external command (sbatch, scancel) failed; a submit was rolled back
EXIT_SLURM_DOWN = 4  #: Slurm did not answer (controller unreachable after every retry)
EXIT_TESTBED = 5  #: the local test cluster could not be started or used
EXIT_STATE_CORRUPT = 6  #: the state file is corrupted, foreign, or from a newer hetsched
EXIT_STATE_READONLY = 7  #: the state file is read-only (not corrupted)
EXIT_STATE_PERMISSION = 8  #: the state file or its directory cannot be read or written
EXIT_STATE_EMPTY = 9  #: the state file is empty (0 bytes: truncated)
EXIT_STATE_INCOMPLETE = 10  #: the state file lacks tables (damaged by hand)
EXIT_UNSAFE_FILE = 11  #: a layout, plan, checkpoint or key file another user could write
EXIT_LOCKED = 75  #: a replan, submit or cancel holds the batch's lock (EX_TEMPFAIL: try later)
EXIT_HANGUP = 129  #: SIGHUP (128 + 1): the login session's terminal went away
EXIT_INTERRUPTED = 130  #: SIGINT (128 + 2)
EXIT_TERMINATED = 143  #: SIGTERM (128 + 15)

EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_FAILURE: "failure: a run, a rank or a probe's job code failed; a missing extra "
                  "(pip install named)",
    EXIT_INPUT: "bad input (file, field or flag); the message names it",
    EXIT_COMMAND: "an external command failed (sbatch, scancel, ...); a submit was rolled back",
    EXIT_SLURM_DOWN: "Slurm did not answer (after retries); nothing was acted on",
    EXIT_TESTBED: "the testbed could not be started or used",
    EXIT_STATE_CORRUPT: "state file corrupted, foreign, or written by a newer hetsched",
    EXIT_STATE_READONLY: "state file read-only (not corrupted)",
    EXIT_STATE_PERMISSION: "state file or its directory not readable/writable",
    EXIT_STATE_EMPTY: "state file empty (0 bytes, truncated)",
    EXIT_STATE_INCOMPLETE: "state file lacks tables (damaged by hand)",
    EXIT_UNSAFE_FILE: "a layout, plan, checkpoint or key file another user could have written",
    EXIT_LOCKED: "another replan, submit or cancel holds the batch's lock; try again later",
    EXIT_HANGUP: "hung up (SIGHUP: the login session ended)",
    EXIT_INTERRUPTED: "interrupted (SIGINT)",
    EXIT_TERMINATED: "terminated (SIGTERM)",
}


class HetschedError(Exception):
    """Base class for errors shown to the user without a traceback."""

    exit_code = EXIT_FAILURE


class InputError(HetschedError):
    """Bad input: a file, a job spec, a field, a flag value.

    ``source`` is the file (or ``--flag``), ``where`` narrows it down (a job
    name, a field path, a CSV line), ``message`` says what is wrong and what
    would be valid.
    """

    exit_code = EXIT_INPUT

    def __init__(self, source: str, message: str, where: str | None = None) -> None:
        self.source = str(source)
        self.where = where
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        loc = self.source if not self.where else f"{self.source}: {self.where}"
        return f"{loc}: {self.message}"


class UnsafeFileError(InputError):
    """A file hetsched would act on (a layout, plan, checkpoint, key) that another user
    could have written: refused, not read."""

    exit_code = EXIT_UNSAFE_FILE


class PlanningError(HetschedError):
    """The inputs are valid but no plan can be made (e.g. a size limit)."""

    exit_code = EXIT_INPUT

