"""The one place in hetsched that runs external commands.

Every command is an argument list (never a shell string), runs with a
timeout, and is retried a bounded number of times with exponential backoff
(tenacity) when Slurm reports a *transient* failure (the controller is restarting, a
socket timed out). Errors quote the command's own stderr so the user sees
Slurm's message, not ours.

Non-idempotent commands (``sbatch``) must not be retried blindly: a "Socket
timed out" may mean the job *was* submitted and only the reply was lost. The
caller passes ``retry_on=SAFE_TRANSIENT`` for those, which only retries when
the controller was never reached.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tenacity

from hetsched.errors import EXIT_COMMAND, EXIT_SLURM_DOWN, HetschedError

#: stderr fragments meaning "try again later": the controller is busy or restarting.
TRANSIENT = re.compile(
    r"Socket timed out|Unable to contact slurm controller|Connection refused"
    r"|Zero Bytes were transmitted|Transport endpoint is not connected"
    r"|Resource temporarily unavailable|temporarily unable to accept"
    r"|Connection timed out|Communication connection failure"
    r"|Slurm backup controller in standby mode|Unable to establish controller",
    re.IGNORECASE,
)
#: transient failures where the request certainly never reached slurmctld,
#: so retrying a non-idempotent command cannot duplicate it.
log = logging.getLogger("hetsched.slurm")

SAFE_TRANSIENT = re.compile(
    r"Unable to contact slurm controller|Connection refused|Unable to establish controller",
    re.IGNORECASE,
)


def hint(argv: Sequence[str], output: str) -> str:
    """What to do about a Slurm command's failure that says the machine cannot use
    Slurm as hetsched does ("" for any other failure): no configuration found, or no
    ``--json`` output (Slurm before 21.08, or built without its JSON serializer)."""
    low = output.lower()
    if "could not establish a configuration source" in low or "fetch_config" in low:
        return ("no Slurm configuration on this machine: set SLURM_CONF to the cluster's "
                "slurm.conf, or run hetsched on a login node of the cluster")
    if "--json" in argv and "json" in low and any(
            w in low for w in ("unrecognized option", "invalid option", "plugin", "serializer")):
        return ("hetsched reads Slurm's --json output: it needs Slurm 21.08 or later, "
                "built with JSON support (its serializer/json plugin)")
    return ""


#: scontrol's answer when the job it would change no longer waits: it started ("Job is
#: no longer pending execution for job N"), ended ("Job has already finished for job N")
#: or is gone ("Invalid job id specified for job N"); Slurm 22.05 on the testbed
NOT_PENDING = re.compile(r"no longer pending|already finished|invalid job id specified",
                         re.IGNORECASE)


class CommandError(HetschedError):
    """An external command failed; the message quotes its stderr."""

    exit_code = EXIT_COMMAND

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str,
                 note: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.note = note
        super().__init__(str(self))

    def __str__(self) -> str:
        tail = " ".join(line.strip() for line in self.stderr.strip().splitlines()[-3:])
        what = f"`{' '.join(self.argv[:3])}{' ...' if len(self.argv) > 3 else ''}`"
        # exit status 0 and still an error: Slurm's --json commands answer so (an errors list)
        code = ("timed out" if self.returncode is None else "answered with an error"
                if self.returncode == 0 else f"exited {self.returncode}")
        msg = f"{what} {code}"
        if tail:
            msg += f": {tail}"
        if self.note:
            msg += f" ({self.note})"
        return msg

    @property
    def transient(self) -> bool:
        return self.returncode is None or bool(TRANSIENT.search(self.stderr))

    @property
    def not_pending(self) -> bool:
        """scontrol refused to change a job because it no longer waits (NOT_PENDING)."""
        return bool(NOT_PENDING.search(self.stderr))


class _Transient(Exception):
    """Internal: an attempt failed in a way ``retry_on`` may retry."""

    def __init__(self, error: CommandError) -> None:
        super().__init__(str(error))
        self.error = error


def _retryable(error: CommandError, retry_on: re.Pattern[str] | None) -> bool:
    """Whether ``error`` may be retried under ``retry_on`` (timeouts: only idempotent ones)."""
    if retry_on is None:
        return False
    if error.returncode is None:
        return retry_on.pattern == TRANSIENT.pattern
    return bool(retry_on.search(error.stderr))


class SlurmUnavailable(CommandError):
    """Slurm did not answer: the controller could not be reached (after every retry).

    Not an empty answer: a caller must not act on it (no job is "gone", no
    partition "empty"). The CLI prints ``Slurm did not answer: ...`` and exits
    with :data:`hetsched.errors.EXIT_SLURM_DOWN`.
    """

    exit_code = EXIT_SLURM_DOWN

    def __str__(self) -> str:
        return f"Slurm did not answer: {super().__str__()}"


@dataclass
class Result:
    """Outcome of one command (after retries)."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    attempts: int


@dataclass
class Runner:
    """Runs commands with timeouts and bounded retries; counts what it ran.

    ``env`` entries are added to the inherited environment (e.g. ``SLURM_CONF``).
    ``counts`` records how many times each program ran, which is how the
    monitor's "one squeue per cycle" promise is measured.
    """

    env: Mapping[str, str] | None = None
    timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    counts: Counter[str] = field(default_factory=Counter)
    sleep: Callable[[float], None] = field(default_factory=lambda: time.sleep)

    def _env(self, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
        if not self.env and environ is None:
            return None
        e = dict(os.environ if environ is None else environ)
        e.update(self.env or {})
        return e

    def run(self, argv: Sequence[str], *, check: bool = True, timeout_s: float | None = None,
            retries: int | None = None, retry_on: re.Pattern[str] | None = TRANSIENT,
            input: str | None = None, output_path: str | Path | None = None,
            environ: Mapping[str, str] | None = None) -> Result:
        """Run ``argv``; retry transient failures matching ``retry_on``.

        ``environ``, if given, replaces this process's environment as the
        command's (``env`` entries still go on top).

        ``output_path`` sends stdout/stderr to a file instead of pipes: used
        for daemons, which fork and could keep a pipe open forever.
        Raises CommandError (non-zero exit with ``check``), SlurmUnavailable
        (transient failures outlasted the retries) or CommandError for a
        program that is not installed.
        """
        argv = [str(a) for a in argv]
        if not argv or any("\0" in a for a in argv):
            raise CommandError(argv, -1, "", "empty command or NUL byte in an argument")
        tries = 1 + max(0, self.retries if retries is None else retries)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        t0 = time.monotonic()
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(tries),
            wait=tenacity.wait_exponential(multiplier=self.backoff_s, exp_base=2,
                                           max=self.max_backoff_s),
            retry=tenacity.retry_if_exception(
                lambda e: isinstance(e, _Transient) and _retryable(e.error, retry_on)),
            sleep=self.sleep, reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    n = attempt.retry_state.attempt_number
                    result = self._once(argv, check=check, timeout=timeout, input=input,
                                        output_path=output_path, retry_on=retry_on,
                                        env=self._env(environ))
                    return Result(argv, result[0], result[1], result[2],
                                  time.monotonic() - t0, n)
        except _Transient as t:
            if not _retryable(t.error, retry_on):
                raise t.error from None
            raise SlurmUnavailable(t.error.argv, t.error.returncode, t.error.stderr,
                                   f"still failing after {tries} attempts; is slurmctld up?"
                                   ) from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _once(self, argv: list[str], *, check: bool, timeout: float, input: str | None,
              output_path: str | Path | None,
              retry_on: re.Pattern[str] | None,
              env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """One attempt: (returncode, stdout, stderr), or _Transient / CommandError."""
        self.counts[Path(argv[0]).name] += 1
        log.debug("run: %s", " ".join(argv))
        proc: subprocess.CompletedProcess[Any]
        stdout: str
        stderr: str
        try:
            if output_path is not None:
                with open(output_path, "ab") as out:
                    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, timeout=timeout,
                                          env=env, check=False)
                stdout = stderr = ""
            else:
                proc = subprocess.run(argv, input=input, capture_output=True, text=True,
                                      timeout=timeout, env=env, check=False,
                                      stdin=None if input is not None else subprocess.DEVNULL)
                stdout, stderr = proc.stdout, proc.stderr
        except FileNotFoundError:
            raise CommandError(argv, -1, "", f"{argv[0]!r} is not installed or not on PATH"
                               ) from None
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else ""
            last = CommandError(argv, None, err, f"no answer within {timeout:g} s")
            if retry_on is None or retry_on.pattern != TRANSIENT.pattern:
                # a timed-out non-idempotent command may have taken effect
                raise last from None
            raise _Transient(last) from None
        if proc.returncode == 0 or not check:
            return proc.returncode, stdout, stderr
        failed = CommandError(argv, proc.returncode, stderr or stdout, hint(argv, stderr or stdout))
        if not _retryable(failed, retry_on):
            raise failed
        raise _Transient(failed)

    def total(self) -> int:
        """Commands run so far (each retry counts)."""
        return sum(self.counts.values())
