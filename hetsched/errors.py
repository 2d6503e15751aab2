"""Errors that reach the user as one clear line.

Every error caused by bad input names where it came from (a file, a job, a
field) and what would have been valid. The CLI prints ``str(err)`` and exits
with code 2; nothing below the CLI prints or exits.
"""

from __future__ import annotations


class HetschedError(Exception):
    """Base class for errors shown to the user without a traceback."""

    exit_code = 1


class InputError(HetschedError):
    """Bad input: a file, a job spec, a field, a flag value.

    ``source`` is the file (or ``--flag``), ``where`` narrows it down (a job
    name, a field path, a CSV line), ``message`` says what is wrong and what
    would be valid.
    """

    exit_code = 2

    def __init__(self, source: str, message: str, where: str | None = None) -> None:
        self.source = str(source)
        self.where = where
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        loc = self.source if not self.where else f"{self.source}: {self.where}"
        return f"{loc}: {self.message}"


class PlanningError(HetschedError):
    """The inputs are valid but no plan can be made (e.g. a size limit)."""

    exit_code = 2

