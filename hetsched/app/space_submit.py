"""Space mode's submit: each job's first segment becomes one heterogeneous Slurm job
(a co-location group's jobs one job together: app/group_submit.py).

Guarantees (see docs/slurm.md):

* **All or nothing.** Every script is rendered before the first ``sbatch``;
  if any ``sbatch`` fails, the jobs this call submitted are cancelled (and any
  job carrying this call's tag that a lost reply left behind), their records
  removed, and the error quotes Slurm's message.
* **Idempotent.** A submission is keyed on (plan id, job, segment). The
  intent is written to the store *before* ``sbatch`` and the id right after;
  a re-run skips what has an id and, for an intent without one (a crash
  between the two writes), first looks for the job in Slurm by its
  ``--comment`` tag instead of submitting twice.
* **In the plan's order.** Jobs are submitted by the start of their first
  segment; a job that takes GPUs another job frees gets
  ``--dependency=afterany:<that job>`` (app/order.py), so Slurm starts what
  the plan starts, when the plan starts it.
* **Interrupt-safe.** SIGINT/SIGTERM/SIGHUP during the sbatch loop are held
  until the sbatch in flight is recorded; then the jobs this call submitted are
  cancelled and their records removed (exit 130 for SIGINT, 143 for SIGTERM,
  129 for SIGHUP: an ssh session that drops): all or nothing. Under ``nohup``
  (SIGHUP ignored from the start) a hangup stays ignored. Anything else that
  stops the loop between two sbatches rolls back too.
* **Runnable.** A job with no command, no entrypoint and no built-in
  workload (or a built-in with an absurd dataset) is refused before anything
  is sent, naming each such job and why (``--skip-unplaceable``: the rest).
* **Options.** Each job gets a time limit from its predicted duration (or
  its ``slurm: time``), SIGUSR1 before it (``--signal``; the script
  has the step checkpoint, then requeues), and the account/QoS/memory/constraint/extra
  options of its spec, the jobs file, ``hetsched submit`` and the config.
* Later segments are not submitted here: ``hetsched replan`` submits the next
  segment when the current one ends, so Slurm always runs what the latest plan
  says.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

from hetsched.app.group_submit import Unit, render_groups, unit_order, unit_preds, units_of
from hetsched.app.order import dependency_expr, plan_order, predecessors
from hetsched.app.runnable import (
    UnrunnableError,
    check_node_types,
    host_local_files,
    listing,
    node_fit_notes,
    unavailable_node_note,
    unrunnable,
)
from hetsched.app.submission import (
    LIVE_STATES,
    Site,
    SubmitError,
    SubmitInterrupted,
    SubmitResult,
    base_sbatch,
    check_plan,
    deferred_signals,
    files_dir,
    job_sbatch,
    refuse_active_elsewhere,
)
from hetsched.core.plan import Plan
from hetsched.core.sbatch import SbatchOptions
from hetsched.errors import HetschedError
from hetsched.io.files import atomic_write, private_dir
from hetsched.io.jobfiles import JobFiles, logs_dir, plan_copy
from hetsched.io.layout import write_job_layout
from hetsched.io.plan_json import dump_plan
from hetsched.slurm.client import SlurmClient
from hetsched.slurm.runner import CommandError
from hetsched.slurm.templates import Script, render_hetjob
from hetsched.state.store import SUBMITTING, SUPERSEDED, Store

log = logging.getLogger("hetsched")


def render_job_scripts(plan: Plan, pid: str, *, plan_path: Path, log_dir: Path,
                partition: str | None, pin_nodes: bool = True,
                only: set[str] | None = None, segment_of: Mapping[str, int] | None = None,
                sbatch: SbatchOptions | None = None,
                site: Site | None = None) -> dict[str, tuple[int, Script]]:
    """Render every job's script (segment 0 unless ``segment_of`` says otherwise).

    Each job's sbatch options are its spec's ``slurm:`` over ``sbatch`` (see
    :func:`base_sbatch`); without a ``time`` the limit comes from the
    segment's predicted duration (:func:`time_limit`). ``site``: the partition as
    Slurm reports it (GPU type spelling, MaxTime; none in a dry run).
    """
    site = site if site is not None else Site(partition)
    out: dict[str, tuple[int, Script]] = {}
    base = sbatch if sbatch is not None else base_sbatch()
    for j in plan.jobs:
        if only is not None and j.name not in only:
            continue
        seg = (segment_of or {}).get(j.name, 0)
        if seg >= len(j.segments) or not j.segments[seg].workers:
            continue  # nothing (left) to run for this job
        opts = job_sbatch(j.spec, base)
        s = j.segments[seg]
        limit, warn = site.limit(j.name, opts, s.end_s - s.start_s)
        out[j.name] = (seg, render_hetjob(
            pid, j, seg, plan_path=plan_path, log_dir=log_dir, partition=partition,
            pin_nodes=pin_nodes, sbatch=opts, time_min=limit, signal_s=warn,
            gres_names=site.gres_names))
    return out


def render_units(plan: Plan, pid: str, *, plan_path: Path, log_dir: Path,
                 partition: str | None, pin_nodes: bool = True, only: set[str] | None = None,
                 segment_of: Mapping[str, int] | None = None,
                 sbatch: SbatchOptions | None = None, source: str = "plan",
                 site: Site | None = None
                 ) -> tuple[dict[str, tuple[int, Script]], dict[str, Unit], dict[str, str]]:
    """Every unit's script: isolated jobs (``render_job_scripts``) and co-location groups, one
    script per group (app/group_submit.py); and the units, and each job's unit."""
    names = set()
    for j in plan.jobs:
        seg = (segment_of or {}).get(j.name, 0)
        if (only is None or j.name in only) and seg < len(j.segments) \
                and j.segments[seg].workers:
            names.add(j.name)
    units, unit_of = units_of(plan, pid, names, segment_of, source)
    alone = {n for n, u in units.items() if u.group is None}
    scripts = render_job_scripts(plan, pid, plan_path=plan_path, log_dir=log_dir, partition=partition,
                          pin_nodes=pin_nodes, only=alone, segment_of=segment_of,
                          sbatch=sbatch, site=site)
    scripts.update(render_groups(plan, pid, units, plan_path=plan_path, log_dir=log_dir,
                                 partition=partition, pin_nodes=pin_nodes,
                                 sbatch=sbatch if sbatch is not None else base_sbatch(),
                                 site=site))
    return scripts, units, unit_of


def submit_space(plan: Plan, store: Store | None, client: SlurmClient | None, *,
           dry_run: bool = False, partition: str | None = None, pin_nodes: bool = True,
           only: set[str] | None = None, segment_of: Mapping[str, int] | None = None,
           source: str = "plan", allow_active_elsewhere: bool = False,
           progress: Callable[[str], None] | None = None,
           sbatch: SbatchOptions | None = None, check_runnable: bool = True,
           skip_unrunnable: bool = False, files_base: Path | None = None) -> SubmitResult:
    """Space mode: the first segment of each job of ``plan`` as a hetjob (module doc).

    ``only`` restricts to some jobs (replan), ``segment_of`` picks another
    segment per job. With ``dry_run`` nothing is written and Slurm is not
    touched: the result carries the scripts (and the jobs that would fail), rendered
    with the real paths of ``files_base`` (the state file's ``.files`` folder) so a
    dry run fails where the submit would.
    Jobs that would fail where they run (app/runnable.py) are refused, or
    left out with ``skip_unrunnable``.
    """
    if plan.mode != "space":
        raise HetschedError(f"a {plan.mode}-mode plan reached space mode's submit; "
                            "submit it with hetsched.app.submit.submit")
    pid = check_plan(plan, source)
    preds = predecessors(plan)
    bad = unrunnable(plan, only) if check_runnable else []
    if bad and not dry_run and not skip_unrunnable:
        raise UnrunnableError(source, f"{len(bad)} of {len(only or plan.jobs)} jobs would fail "
                              f"where they run: {listing(bad)}; fix them, or pass "
                              "--skip-unplaceable to submit the rest", "jobs")
    if bad and not dry_run:
        only = {j.name for j in plan.jobs if only is None or j.name in only} - {n for n, _ in bad}
    if dry_run:
        base = files_dir(store) if store is not None else (files_base or Path("hetsched-files"))
        scripts, units, unit_of = render_units(
            plan, pid, plan_path=plan_copy(base, pid), log_dir=logs_dir(base),
            partition=partition, pin_nodes=pin_nodes, only=only, segment_of=segment_of,
            sbatch=sbatch, source=source)
        upreds = unit_preds(preds, units)
        return SubmitResult(pid, None, scripts={k: v[1] for k, v in scripts.items()},
                            order=unit_order(plan_order(plan, set(unit_of)), unit_of),
                            after={k: v for k, v in upreds.items() if k in scripts},
                            unrunnable=bad)
    if store is None or client is None:
        raise HetschedError("submit needs a state store and a Slurm client (or --dry-run)")
    base = files_dir(store)
    plan_path, logs = plan_copy(base, pid), logs_dir(base)
    nodes = client.nodes(partition)  # GPU types as Slurm spells them, each node's type
    site = Site.of(client, partition, nodes)
    # render everything first: a bad value fails before anything reaches Slurm
    scripts, units, unit_of = render_units(
        plan, pid, plan_path=plan_path, log_dir=logs, partition=partition,
        pin_nodes=pin_nodes, only=only, segment_of=segment_of, sbatch=sbatch, source=source,
        site=site)
    check_node_types(plan, nodes, set(unit_of), pin_nodes, partition, source)
    for note in [unavailable_node_note(plan, nodes, set(unit_of), pin_nodes),
                 host_local_files(base, nodes), site.capped_note(), *node_fit_notes(
            plan, units, _unit_cpus(plan, units, sbatch), site.node_cpus, site.exclusive,
            partition)]:
        if note:
            log.warning("%s", note)
    if not allow_active_elsewhere:
        refuse_active_elsewhere(store, client, pid, set(unit_of))
    private_dir(logs)
    if not plan_path.exists():
        atomic_write(plan_path, dump_plan(plan) + "\n")
    store.add_plan(plan.to_dict(), source=source)
    order = unit_order(plan_order(plan, set(unit_of)), unit_of)
    upreds = unit_preds(preds, units)
    result = SubmitResult(pid, plan_path, scripts={k: v[1] for k, v in scripts.items()},
                          order=order, after={k: v for k, v in upreds.items() if k in scripts},
                          unrunnable=bad)

    _submit_in_order(plan, store, client, scripts, units, upreds, result, base, progress, pin_nodes)
    if result.submitted:
        store.add_event("submitted", detail=json.dumps(
            {"plan_id": pid, "jobs": dict(result.submitted)}), handled=True)
    return result


def _submit_in_order(plan: Plan, store: Store, client: SlurmClient,
                     scripts: Mapping[str, tuple[int, Script]], units: Mapping[str, Unit],
                     preds: Mapping[str, list[str]], result: SubmitResult, base: Path,
                     progress: Callable[[str], None] | None, pin_nodes: bool = True) -> None:
    """The sbatch loop (:func:`_sbatch_loop`), all or nothing: a failed sbatch or a
    signal rolls back there; anything else that stops it between two sbatches (the
    terminal gone under a progress line after a hangup, a full disk under the next
    script) rolls back here."""
    mine: list[tuple[int, str, str]] = []  # (submission row, job, slurm id) of this call
    #: (intent row, unit) of the unit whose sbatch is under way
    inflight: list[tuple[int, str]] = []
    with deferred_signals() as caught:
        try:
            _sbatch_loop(plan, store, client, scripts, units, preds, result, base, progress,
                         pin_nodes, mine, inflight, caught)
        except (SubmitError, SubmitInterrupted):
            raise  # rolled back already
        except Exception:  # (SIGKILL, simulated by SystemExit in tests, is not caught)
            _rollback(store, client, result.plan_id, mine, [r for r, _ in inflight],
                      inflight[0][1] if inflight else None)
            if caught:  # the signal is the cause (a hangup, then EIO on the terminal)
                raise SubmitInterrupted(_interrupted(caught[0], len(mine) + len(inflight),
                                                     len(result.order), len(mine)),
                                        caught[0]) from None
            raise


def _interrupted(signum: int, done: int, total: int, cancelled: int) -> str:
    return (f"submit interrupted by {signal.Signals(signum).name} after {done} of {total} "
            f"jobs; cancelled the {cancelled} this run had submitted; nothing from this run "
            "remains queued")


def _sbatch_loop(plan: Plan, store: Store, client: SlurmClient,
                 scripts: Mapping[str, tuple[int, Script]], units: Mapping[str, Unit],
                 preds: Mapping[str, list[str]], result: SubmitResult, base: Path,
                 progress: Callable[[str], None] | None, pin_nodes: bool,
                 mine: list[tuple[int, str, str]], inflight: list[tuple[int, str]],
                 caught: list[int]
                 ) -> None:
    """Unit by unit (a job, or a group's one job), in the plan's order, with
    dependencies; ``mine`` collects this call's submissions, ``inflight`` the intent rows
    of the unit being submitted."""
    pid, order = result.plan_id, result.order
    # crash recovery: intents without an id may have reached Slurm
    intents = {m: store.submission(pid, *m) for u in order for m in units[u].members}
    orphans = [s for s in intents.values()
               if s is not None and s.slurm_id is None and s.state == SUBMITTING]
    found = _find_tagged(client, pid) if orphans else {}
    # the ids the plan's order refers to: queued jobs of any plan, then this call's
    ids = {s.job: s.slurm_id for s in store.submissions()
           if s.slurm_id and s.state in LIVE_STATES}

    for i, name in enumerate(order):
        seg, script = scripts[name]
        unit = units[name]
        prev = [intents[m] for m in unit.members]
        if all(p is not None and p.slurm_id and p.state != SUPERSEDED for p in prev):
            for (job, _), p in zip(unit.members, prev, strict=True):
                assert p is not None and p.slurm_id
                result.skipped.append((job, p.slurm_id))
                ids[job] = p.slurm_id
            continue
        if unit.comment in found and any(p in orphans for p in prev):
            for (job, _), p in zip(unit.members, prev, strict=True):
                if p is not None:
                    store.set_submitted(p.id, found[unit.comment])
                result.skipped.append((job, found[unit.comment]))
                ids[job] = found[unit.comment]
            continue
        files = JobFiles(base, pid, name, seg)
        path = files.script
        atomic_write(path, script.text)
        write_job_layout(files, plan, pin_nodes, alone=unit.group is None)
        with store.tx():  # every member's intent, or none
            subs = [store.begin_submission(
                pid, job, k, script.sha256, str(path),
                [w.to_dict() for w in plan.job(job).segments[k].workers])
                for job, k in unit.members]
        inflight[:] = [(sub.id, name) for sub in subs]
        dep = dependency_expr(preds.get(name, []), ids)
        try:
            jid = client.submit(path, extra_args=[f"--dependency={dep}"] if dep else ())
        except CommandError as e:
            _rollback(store, client, pid, mine, [s.id for s in subs], name)
            done = ", ".join(j for _, j, _ in mine)
            raise SubmitError(
                f"sbatch failed for {'group' if unit.group else 'job'} {name!r} ({i + 1} "
                f"of {len(order)}): {e}; "
                + (f"cancelled what this run had submitted ({done}); " if mine else "")
                + "nothing from this run remains queued") from None
        for sub in subs:
            store.set_submitted(sub.id, jid)
            ids[sub.job] = jid
            mine.append((sub.id, sub.job, jid))
            result.submitted.append((sub.job, jid))
        inflight.clear()
        if progress:
            what = (f"group {unit.group.group} ({', '.join(unit.group.jobs)})"
                    if unit.group else name)
            progress(f"submitted {what} as Slurm job {jid}" + (f" ({dep})" if dep else ""))
        if caught:
            _rollback(store, client, pid, mine, [], None)
            raise SubmitInterrupted(_interrupted(caught[0], i + 1, len(order), len(mine)),
                                    caught[0])


def _unit_cpus(plan: Plan, units: Mapping[str, Unit], sbatch: SbatchOptions | None
               ) -> dict[str, int]:
    """Each unit's CPU cores per GPU: a job's own ``cpus_per_gpu`` over ``sbatch`` (the
    submit's and the config's); a co-location group's, ``sbatch``'s."""
    base = sbatch if sbatch is not None else base_sbatch()
    return {name: (base if u.group is not None else job_sbatch(
        plan.job(u.members[0][0]).spec, base)).cpus_per_gpu or 1 for name, u in units.items()}


def _find_tagged(client: SlurmClient, pid: str) -> dict[str, str]:
    """Slurm jobs (active) whose comment tags them as this plan's: tag -> leader id."""
    out: dict[str, str] = {}
    for j in client.jobs():
        if j.comment.startswith(f"hetsched:{pid}:") and not j.finished and j.mine:
            out.setdefault(j.comment, j.leader)
    return out


def _rollback(store: Store, client: SlurmClient, pid: str,
              mine: list[tuple[int, str, str]], failed_rows: list[int],
              failed_job: str | None) -> None:
    """Cancel this call's jobs (and any tagged job a lost reply left), drop their rows."""
    ids = {jid for _, _, jid in mine}
    jobs = {n for _, n, _ in mine} | ({failed_job} if failed_job else set())
    try:
        tagged = _find_tagged(client, pid)
    except CommandError:
        tagged = {}
    for tag, jid in tagged.items():
        # a failed sbatch whose reply was lost may still have created a job
        if tag.split(":")[2:3] and tag.split(":")[2] in jobs:
            ids.add(jid)
    if ids:
        client.cancel(sorted(ids))
    with store.tx():
        for row, _, _ in mine:
            store.delete_submission(row)
        for row in failed_rows:
            store.delete_submission(row)
    store.add_event("submit-rollback", detail=json.dumps({"plan_id": pid,
                                                          "cancelled": sorted(ids)}),
                    handled=True)
