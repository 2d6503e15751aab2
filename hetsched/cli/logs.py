"""Logging for the command line: ``hetsched -v``/``-vv``/``-q``, through Python's logging.

The library logs under the ``hetsched`` logger (``hetsched.slurm`` every
command it runs, at DEBUG; ``hetsched.replan`` each replan step, at INFO) and
never configures logging itself; this module does it once per process:

* default: warnings and errors;
* ``-v``: info (what each step decided), ``-vv``: debug (every Slurm command);
* ``-q``: errors only, and no progress bars.

On a terminal the lines go through rich's handler (time, level, colour); under
cron or a pipe they are plain ``hetsched: LEVEL: message`` lines on stderr.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "hetsched"


def level_for(verbose: int, quiet: bool) -> int:
    if quiet:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)


def setup(verbose: int = 0, quiet: bool = False) -> None:
    """Configure the ``hetsched`` logger once (a second call only changes the level)."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level_for(verbose, quiet))
    logger.propagate = False
    if logger.handlers:
        return
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False,
                              rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Plain())
    logger.addHandler(handler)


class _Plain(logging.Formatter):
    """``hetsched: warning: message``: the same shape as hetsched's error lines."""

    def format(self, record: logging.LogRecord) -> str:
        return f"hetsched: {record.levelname.lower()}: {record.getMessage()}"


def quiet() -> bool:
    """Whether -q was given (progress bars stay off)."""
    return logging.getLogger(LOGGER).level >= logging.ERROR


def say(text: str) -> None:
    """A progress line on stderr that never stops the work: a reader gone (``| head``:
    EPIPE) or a terminal gone (a hangup: EIO) loses the line, not the batch. A hangup
    itself is a signal, which the command acts on (a submit rolls back)."""
    import click

    try:
        click.echo(text, err=True)
    except OSError:
        pass
