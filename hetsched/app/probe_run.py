"""Running the probes: submit them, wait with one ``squeue`` per poll, cancel those past
their limits, store what came back in the profile history (:mod:`hetsched.state.history`);
on SIGINT/SIGTERM/SIGHUP cancel what is still queued or running.

:mod:`.profile` plans and renders the probes (:class:`~.profile.ProbeOutcome`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from hetsched.app.profile import NOT_LOADED, NOT_RUN, ProbeOutcome, plausible_rows
from hetsched.app.submission import Interrupted, deferred_signals
from hetsched.core.report import NULL_REPORTER, BaseReporter
from hetsched.errors import EXIT_INPUT, InputError
from hetsched.io.jobfiles import log_cause, log_of
from hetsched.io.profiles import parse_csv
from hetsched.slurm.runner import SlurmUnavailable
from hetsched.state.history import OK, UNUSABLE, import_rows, set_status
from hetsched.state.store import Store

__all__ = ["ProbesInterrupted", "run_probes"]


class ProbesInterrupted(Interrupted):
    """SIGINT/SIGTERM/SIGHUP while probes were queued or running: those were cancelled,
    the finished ones recorded."""


def run_probes(outcomes: list[ProbeOutcome], client: Any, store: Store, *,
               time_limit_s: float, queue_wait_s: float = 120.0, poll_s: float = 1.0,
               grace_s: float = 15.0,
               progress: Callable[[str], None] | None = None,
               reporter: BaseReporter | None = None) -> list[ProbeOutcome]:
    """Submit every probe, wait for all (one squeue per poll), store the results.

    A probe that sbatch refuses, that fails, or that runs past ``time_limit_s``
    marks its pair unusable; one still queued after ``queue_wait_s`` (it is
    cancelled) or whose sbatch Slurm did not answer is :data:`NOT_RUN`: nothing
    is recorded for its pair. The others carry on. ``grace_s`` beyond the time
    limit covers the probe's start-up (importing torch) before its own
    ``--time-limit`` clock starts.

    SIGINT/SIGTERM/SIGHUP (Ctrl-C, a kill, a dropped ssh session) are held while an
    sbatch is in flight; then no more probes are submitted, those queued or running are
    cancelled (one scancel) and are :data:`NOT_RUN`, what had finished is
    recorded as usual, and :class:`ProbesInterrupted` is raised: an interrupted
    profile leaves no probe job behind in the queue.
    """
    say = progress or (lambda m: None)
    rep = reporter or NULL_REPORTER
    with deferred_signals() as caught:
        _submit_probes(outcomes, client, say, caught)
        pending = [o for o in outcomes if o.status == "pending"]
        while pending and not caught:
            rep.probes(sum(o.started_at is None for o in pending),
                       sum(o.started_at is not None for o in pending),
                       len(outcomes) - len(pending), len(outcomes))
            time.sleep(poll_s)
            if not caught:
                _poll_probes(pending, client, time_limit_s=time_limit_s,
                             queue_wait_s=queue_wait_s, grace_s=grace_s)
        cancelled: list[str] = []
        left: list[str] = []
        if caught:
            cancelled, left = _cancel_probes(pending, client, caught[0])
        # recorded with the signals still held: a second Ctrl-C loses no finished probe
        if not caught:
            rep.probes(0, 0, len(outcomes), len(outcomes))
        _record(outcomes, store, say, interrupted=bool(caught))
    if caught:
        done = sum(o.status in ("ok", UNUSABLE) for o in outcomes)
        raise ProbesInterrupted(_interrupted_message(caught[0], cancelled, left, done),
                                caught[0])
    return outcomes


def _record(outcomes: list[ProbeOutcome], store: Store, say: Callable[[str], None], *,
            interrupted: bool) -> None:
    """Store each finished probe's rows or its pair's mark, and say each outcome (after an
    interrupt, not the cancelled ones: the last line counts them)."""
    for o in outcomes:  # all stored before a line is said: a hung-up terminal fails those
        if o.status == "ok":
            import_rows(store, o.rows, f"probe:{o.slurm_id}")
            set_status(store, o.spec.workload, o.spec.gpu_type, OK, f"probe:{o.slurm_id}",
                       o.slurm_id, o.seconds)
        elif o.status == UNUSABLE:
            set_status(store, o.spec.workload, o.spec.gpu_type, UNUSABLE, o.reason, o.slurm_id,
                       o.seconds)
    for o in outcomes:
        if interrupted and o.status == NOT_RUN:
            continue
        say(f"probe {o.spec.workload} on {o.spec.gpu_type}: {o.status}"
            + (f" ({o.reason})" if o.reason else f", {len(o.rows)} rows")
            + (f"; left out as disturbed: {'; '.join(o.dropped)}" if o.dropped else ""))


def _submit_probes(outcomes: list[ProbeOutcome], client: Any, say: Callable[[str], None],
                   caught: list[int]) -> None:
    """sbatch each probe; after a signal, the rest are not submitted (:data:`NOT_RUN`)."""
    for o in outcomes:
        if caught:
            o.status, o.reason = NOT_RUN, "not submitted: profile was interrupted"
            continue
        try:
            o.slurm_id = client.submit(str(o.script))
        except SlurmUnavailable as e:  # says nothing about the pair
            o.status, o.reason = NOT_RUN, f"Slurm did not answer sbatch: {e}"
            continue
        except Exception as e:  # noqa: BLE001 - any sbatch failure only loses this pair
            o.status, o.reason = UNUSABLE, f"sbatch failed: {e}"
            continue
        o.submitted_at = time.monotonic()
        say(f"probe {o.spec.workload} on {o.spec.gpu_type}: Slurm job {o.slurm_id}")


def _poll_probes(pending: list[ProbeOutcome], client: Any, *, time_limit_s: float,
                 queue_wait_s: float, grace_s: float) -> None:
    """One squeue: note starts, cancel probes past their limits, collect finished ones
    (each leaves ``pending``)."""
    jobs = {j.job_id: j for j in client.jobs()}
    now = time.monotonic()
    for o in list(pending):
        j = jobs.get(str(o.slurm_id))
        if j is not None and not j.finished:
            if j.state == "RUNNING" and o.started_at is None:
                o.started_at = now
            late_run = (o.started_at is not None
                        and now - o.started_at > time_limit_s + grace_s)
            late_queue = o.started_at is None and now - o.submitted_at > queue_wait_s
            if late_run or late_queue:
                client.cancel([str(o.slurm_id)])
                o.status = UNUSABLE if late_run else NOT_RUN
                o.reason = (f"timed out after {time_limit_s:g} s" if late_run else
                            f"still {j.state.lower()} after {queue_wait_s:g} s in the queue"
                            f" ({j.reason or 'no reason given'}); cancelled, nothing "
                            "recorded: profile again later, or give --queue-wait more")
                pending.remove(o)
            continue
        pending.remove(o)  # finished, or gone from squeue: the output file tells
        o.seconds = now - (o.started_at or o.submitted_at)
        _collect(o, j.state if j is not None else "GONE",
                 j.exit_code if j is not None else None)


def _cancel_probes(pending: list[ProbeOutcome], client: Any, signum: int
                   ) -> tuple[list[str], list[str]]:
    """After a signal: cancel every probe not yet seen to finish, in one scancel. One
    whose results are already written (it ended since the last poll) still counts.
    Returns the Slurm ids cancelled, and those left queued (scancel failed)."""
    ids = [str(o.slurm_id) for o in pending]
    try:
        client.cancel(ids)
    except Exception as e:  # noqa: BLE001 - say which are left rather than hide them
        for o in pending:
            o.status = NOT_RUN
            o.reason = f"profile was interrupted and scancel failed ({e}): still queued"
        return [], ids
    cancelled = []
    for o in pending:
        if o.out is not None and o.out.exists():
            _collect(o, "COMPLETED")
            if o.status == "ok":
                continue
        o.status = NOT_RUN
        o.reason = (f"cancelled: profile was interrupted by {signal.Signals(signum).name}; "
                    "nothing recorded")
        cancelled.append(str(o.slurm_id))
    return cancelled, []


def _interrupted_message(signum: int, cancelled: list[str], left: list[str], done: int
                         ) -> str:
    """The one line an interrupted profile ends with: what it cancelled, what it kept."""
    parts = [f"cancelled {len(cancelled)} probe job(s) (Slurm {', '.join(cancelled)})"] \
        if cancelled else []
    if left:
        parts.append(f"could not cancel Slurm job(s) {', '.join(left)}: scancel them")
    parts.append(f"{done} finished probe(s) recorded")
    return (f"profile interrupted by {signal.Signals(signum).name}: " + "; ".join(parts)
            + "; `hetsched profile` again probes the rest")


def _collect(o: ProbeOutcome, state: str, exit_code: int | None = None) -> None:
    """The probe's rows (ok), or why it has none: unusable, or, when `hetsched probe`
    exited 2 (``exit_code``: bad input, the job's code or data did not load), NOT_LOADED."""
    assert o.out is not None
    try:
        text = o.out.read_text()
        rows = parse_csv(text, str(o.out))
    except (OSError, InputError) as e:
        log = log_of(o.logs, o.slurm_id) if o.logs is not None else None
        cause = log_cause(log) if log is not None else ""
        if exit_code == EXIT_INPUT:
            o.status = NOT_LOADED
            o.reason = (f"exit {exit_code}, the job's code or data; last line of its log: "
                        f"{cause or '-'}; nothing recorded for the pair: fix it and profile "
                        f"again; log {log}")
            return
        o.status = UNUSABLE
        o.reason = (f"probe job ended {state} (last line of its log: {cause}); log {log}"
                    if cause else f"probe job ended {state} without results ({e})")
        return
    rows = [r for r in rows
            if r.workload == o.spec.workload and r.gpu_type == o.spec.gpu_type]
    if not rows:
        o.status, o.reason = UNUSABLE, f"probe job ended {state} with no rows for this pair"
        return
    o.rows, o.dropped = plausible_rows(rows)
    o.status = OK
