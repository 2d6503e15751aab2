"""Watch hetsched's jobs and the partition; turn changes into reset events.

Cost of one poll cycle (what bench/bench_slurm.py measures):

* **one** ``squeue --json`` for every job, whatever their number;
* plus **one** ``sinfo --json`` only when needed: on the first cycle, when a
  job failed/was requeued or waits for a node that is not merely busy, and
  every ``node_every``-th cycle (default 6) so drained nodes and GPUs that
  come back are seen even when no job notices them;
* plus ``scontrol show job`` once per job that vanished from squeue before
  hetsched saw it finish (rare: it needs MinJobAge to pass between polls).

Reset events (they make ``hetsched replan`` act): ``job-completed``,
``job-failed``, ``job-requeued``, ``job-cancelled`` (a user's ``scancel`` or
``hetsched cancel``: final, the job is never resubmitted), ``node-down``, ``node-drained``,
``node-back`` (a GPU node usable again), ``spool-new`` (a new jobs file in
the spool directory). ``job-started`` is recorded for the record only.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import hostlist
import tenacity

from hetsched.core.spec import USABLE_STATES
from hetsched.slurm.client import ACTIVE_STATES, FINISHED_STATES, JobInfo, SlurmClient
from hetsched.slurm.inventory import from_nodes
from hetsched.slurm.runner import SlurmUnavailable
from hetsched.state.store import GONE, SUBMITTING, SUPERSEDED, Store, Submission

RESET_KINDS = frozenset({"job-completed", "job-failed", "job-requeued", "job-cancelled",
                         "job-blocked", "node-down", "node-drained", "node-back", "spool-new"})
#: pending reasons that may mean "a node this job needs is not available". Slurm 22.05
#: gives "ReqNodeNotAvail, UnavailableNodes:NODE" for a node that is down or drained
#: *and* for one that is only busy (a job pinned with --nodelist to a full node),
#: depending on which scheduler pass looked last: see :func:`waits_for_unavailable_node`
NODE_REASONS = ("ReqNodeNotAvail", "NodeDown", "UnavailableNodes")
_UNAVAILABLE_RE = re.compile(r"UnavailableNodes:(\S+)")
_BUSY_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})
#: hetsched's rows that are still worth asking Slurm about
WATCHED = (ACTIVE_STATES | {SUBMITTING, "SUBMITTED"}) - {SUPERSEDED}


@dataclass
class Event:
    kind: str
    job: str | None = None
    node: str | None = None
    slurm_id: str | None = None
    detail: str = ""

    def __str__(self) -> str:
        who = self.job or self.node or ""
        sid = f" (Slurm {self.slurm_id})" if self.slurm_id else ""
        return f"{self.kind}: {who}{sid}{' ' + self.detail if self.detail else ''}"


@dataclass
class Cycle:
    """What one poll cycle saw and cost."""

    events: list[Event] = field(default_factory=list)
    jobs: dict[str, str] = field(default_factory=dict)  # hetsched job -> Slurm state
    infos: dict[str, list[JobInfo]] = field(default_factory=dict)  # job -> components
    commands: int = 0
    seconds: float = 0.0
    checked_nodes: bool = False


def _expand(nodes: str) -> set[str]:
    try:
        return set(hostlist.expand_hostlist(nodes)) if nodes else set()
    except hostlist.BadHostlist:
        return set()


def busy_nodes(jobs: Iterable[JobInfo]) -> set[str]:
    """Nodes on which squeue shows a job running (any user's): busy, so usable."""
    return {n for j in jobs if j.state in _BUSY_STATES for n in _expand(j.nodes)}


def waits_for_unavailable_node(comps: Iterable[JobInfo], busy: set[str]) -> bool:
    """Whether a pending job waits for a node that is not merely busy (down, drained...).

    Slurm's reason text cannot tell (module constant ``NODE_REASONS``), so the
    nodes it names (``UnavailableNodes:``, else the job's ``--nodelist``) are
    checked against the nodes squeue shows running jobs on: when every one of
    them runs a job the job waits for GPUs, not for a node, and no ``sinfo``
    is needed. A node that runs nothing and still keeps a pinned job waiting
    is down, drained or reserved: then the monitor looks.
    """
    for c in comps:
        if not _waits_for_node(c):
            continue
        named = _named_nodes(c)
        if not named or not named <= busy:
            return True
    return False


def _waits_for_node(c: JobInfo) -> bool:
    """Whether a pending component's reason says it waits for a node (NODE_REASONS)."""
    return any(r in c.reason or r in c.reason_detail for r in NODE_REASONS)


def _named_nodes(c: JobInfo) -> set[str]:
    """The nodes a pending component's reason names (else its ``--nodelist``)."""
    m = _UNAVAILABLE_RE.search(c.reason_detail or c.reason)
    return _expand(m.group(1)) if m else _expand(c.required_nodes)


def waited_nodes(comps: Iterable[JobInfo]) -> set[str]:
    """The nodes a pending job waits for, where its reason says it waits for a node."""
    return {n for c in comps if _waits_for_node(c) for n in _named_nodes(c)}


def combined_state(components: list[JobInfo]) -> str:
    """One state for a hetjob from its components' states."""
    states = [c.state for c in components]
    for s in ("RUNNING", "COMPLETING", "CONFIGURING"):
        if s in states:
            return s
    for s in ("NODE_FAIL", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED"):
        if s in states:
            return s
    if states and all(s == "COMPLETED" for s in states):
        return "COMPLETED"
    lead = [c for c in components if not c.het_offset]
    return (lead or components)[0].state if components else "UNKNOWN"


def state_counts(states: Iterable[str]) -> dict[str, int]:
    """running / pending / done / failed / cancelled among job states (``watch``)."""
    out = {"running": 0, "pending": 0, "done": 0, "failed": 0, "cancelled": 0}
    for state in states:
        if state in ("RUNNING", "COMPLETING", "CONFIGURING"):
            out["running"] += 1
        elif state == "COMPLETED":
            out["done"] += 1
        elif state == "CANCELLED":
            out["cancelled"] += 1
        elif state in FINISHED_STATES or state in (GONE, "GAVE_UP"):
            out["failed"] += 1
        else:
            out["pending"] += 1
    return out


class Monitor:
    """Polls Slurm for the store's live submissions and records reset events."""

    def __init__(self, store: Store, client: SlurmClient, *, partition: str | None = None,
                 spool: str | Path | None = None, node_every: int = 6) -> None:
        self.store = store
        self.client = client
        self.partition = partition
        self.spool = Path(spool) if spool else None
        self.node_every = max(1, node_every)
        self.cycles = 0

    def _runner_total(self) -> int:
        runner = getattr(self.client, "runner", None)
        return runner.total() if runner is not None else 0

    def _refine_profiles(self) -> None:
        """Fold what running jobs measured into the profile history (EWMA).

        Reads the ranks' report files from where the last cycle stopped: local
        files only, no Slurm command, so a cycle still runs one ``squeue``.
        """
        from hetsched.app.submission import files_dir
        from hetsched.io.jobfiles import all_reports
        from hetsched.state.history import ingest_reports

        reports = all_reports(files_dir(self.store))
        if reports:
            ingest_reports(self.store, reports)
        from hetsched.app.pool_status import ingest_pool_reports

        ingest_pool_reports(self.store)  # pool executors' task records (app/pool_status.py)

    def live(self) -> list[Submission]:
        return [s for s in self.store.submissions() if s.slurm_id and s.state in WATCHED]

    def poll(self) -> Cycle:
        """One cycle: one squeue (plus sinfo when needed); record and return events."""
        t0, c0 = time.monotonic(), self._runner_total()
        cycle = Cycle()
        jobs = self.client.jobs()
        by_leader: dict[str, list[JobInfo]] = {}
        for j in jobs:
            by_leader.setdefault(j.leader, []).append(j)
        need_nodes = self.cycles % self.node_every == 0
        busy = busy_nodes(jobs)
        waiting: list[tuple[Submission, list[JobInfo]]] = []  # for a node, maybe down
        for sub in self.live():
            assert sub.slurm_id is not None
            comps = by_leader.get(sub.slurm_id)
            if comps is None:
                # Slurm forgot it before we saw it end: ask once, else mark GONE
                comps = self.client.job_detail(sub.slurm_id)
            new = combined_state(comps) if comps else GONE
            cycle.jobs[sub.job] = new
            cycle.infos[sub.job] = comps
            if new == "PENDING" and waits_for_unavailable_node(comps, busy):
                need_nodes = True
                waiting.append((sub, comps))
            ev = self._job_event(sub, new, comps) if new != sub.state else None
            if ev is None or ev.kind != "job-requeued":
                ev = self._missed_requeue(sub, comps) or ev
            if ev is not None:
                cycle.events.append(ev)
                if ev.kind in ("job-failed", "job-requeued"):
                    need_nodes = True
            if new != sub.state:
                self.store.set_state(sub.id, new)
        if need_nodes:
            node_events, unusable = self._node_events()
            cycle.events += node_events + self._blocked_events(waiting, unusable)
            cycle.checked_nodes = True
        cycle.events += self._spool_events()
        self._refine_profiles()
        for ev in cycle.events:
            self.store.add_event(ev.kind, job=ev.job, node=ev.node, slurm_id=ev.slurm_id,
                                 detail=ev.detail, handled=ev.kind not in RESET_KINDS)
        self.cycles += 1
        cycle.commands = self._runner_total() - c0
        cycle.seconds = time.monotonic() - t0
        return cycle

    @staticmethod
    def _job_event(sub: Submission, new: str, comps: list[JobInfo]) -> Event | None:
        sid = sub.slurm_id
        if new == "COMPLETED":
            return Event("job-completed", sub.job, slurm_id=sid)
        if new == "CANCELLED":
            # hetsched marks its own cancels before scancel: this one is a user's
            return Event("job-cancelled", sub.job, slurm_id=sid,
                         detail="cancelled outside hetsched (scancel); final")
        if new in FINISHED_STATES or new == GONE:
            reason = ", ".join(sorted({c.reason for c in comps if c.reason
                                       and c.reason != "None"}))
            return Event("job-failed", sub.job, slurm_id=sid, detail=f"{new} {reason}".strip())
        if new == "PENDING" and sub.state in ("RUNNING", "COMPLETING", "CONFIGURING"):
            return Event("job-requeued", sub.job, slurm_id=sid,
                         detail=", ".join(sorted({c.reason for c in comps})))
        if new == "RUNNING" and sub.state != "RUNNING":
            return Event("job-started", sub.job, slurm_id=sid)
        return None

    def _missed_requeue(self, sub: Submission, comps: list[JobInfo]) -> Event | None:
        """A requeue no poll saw: Slurm counts the job's restarts, the events the
        requeues seen so far. The job ran and is pending again (a node failed under a
        job that ran since the last poll, or under one never seen running), or it ran
        again already (requeued and restarted between two polls: cron's replan every
        few minutes); either way its GPUs may be gone, and the plan's times are."""
        restarts = max((c.restarts for c in comps), default=0)
        # no restart (nearly every job): no query of the state file, every cycle
        if not restarts or restarts <= self.store.event_count("job-requeued", sub.job,
                                                               sub.slurm_id):
            return None
        return Event("job-requeued", sub.job, slurm_id=sub.slurm_id,
                     detail=f"restarted by Slurm (restart {restarts}), unseen by a poll")

    def _blocked_events(self, waiting: list[tuple[Submission, list[JobInfo]]],
                        unusable: Mapping[str, str]) -> list[Event]:
        """A pending job kept waiting by a node that is down or drained, once per Slurm job.

        A node that went down while the monitor watched is a ``node-*`` event. One
        that was already down at the first look (the baseline), or before the job
        was submitted (a plan made earlier, or from a cluster file), changes
        nothing the monitor sees: without this the job would wait for the node
        for ever, and ``replan`` would find nothing to do.
        """
        out = []
        for sub, comps in waiting:
            named = sorted(waited_nodes(comps) & set(unusable))
            if named and not self.store.has_event("job-blocked", sub.job, sub.slurm_id):
                out.append(Event("job-blocked", sub.job, slurm_id=sub.slurm_id,
                                 detail="waits for " + ", ".join(
                                     f"{n} ({unusable[n]})" for n in named)))
        return out

    def _node_events(self) -> tuple[list[Event], dict[str, str]]:
        """Node transitions since the last look; and the unusable nodes now (name: state)."""
        infos = self.client.nodes(self.partition)
        inv = from_nodes(infos, self.partition) if infos else None
        now = {n.name: n for n in inv.cluster.nodes} if inv else {}
        before = self.store.node_snapshot()
        events: list[Event] = []
        if before:  # the first look only records the baseline
            for name, node in now.items():
                old = before.get(name)
                was_usable = old is None or old["state"] in USABLE_STATES
                if was_usable and not node.usable:
                    kind = "node-drained" if node.state in ("drained", "draining") else "node-down"
                    events.append(Event(kind, node=name, detail=node.state))
                elif not was_usable and node.usable:
                    events.append(Event("node-back", node=name,
                                        detail=f"{node.gpus} {node.gpu_type} GPUs"))
        self.store.put_node_snapshot([(n.name, n.state, n.gpu_type, n.gpus)
                                      for n in now.values()])
        return events, {n: node.state for n, node in now.items() if not node.usable}

    def _spool_events(self) -> list[Event]:
        if self.spool is None or not self.spool.is_dir():
            return []
        seen = self.store.spool_seen()
        events = []
        here = sorted(self.spool.glob("*.y*ml"))
        gone = [p for p in seen if Path(p).parent == self.spool and Path(p) not in here]
        if gone:  # retired (done/, rejected/, waiting/) or removed: seen afresh if put back
            self.store.forget_spool_seen(gone)
        for p in here:
            try:
                sha = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                continue  # being written; next cycle
            if seen.get(str(p)) != sha:
                self.store.mark_spool_seen(str(p), sha)
                events.append(Event("spool-new", detail=str(p)))
        return events


def watch(monitor: Monitor, *, interval_s: float = 5.0, max_interval_s: float = 60.0,
          cycles: int | None = None, until: Callable[[Cycle], bool] | None = None,
          on_cycle: Callable[[Cycle], None] | None = None,
          on_wait: Callable[[str], None] | None = None,
          sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll until ``until(cycle)`` or ``cycles`` cycles; returns cycles run.

    The interval grows (x1.5, up to ``max_interval_s``) while nothing changes
    and drops back on a change, so a quiet queue costs little. When slurmctld
    does not answer (restart, outage) the loop waits with exponential backoff
    and resumes; it never gives up on its own.
    """
    def waiting(state: tenacity.RetryCallState) -> None:
        if on_wait and state.outcome is not None and state.next_action is not None:
            on_wait(f"{state.outcome.exception()}; "
                    f"retrying in {state.next_action.sleep:.0f} s")

    # an outage (slurmctld restarting, down) is waited out with exponential backoff, forever
    poll = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(SlurmUnavailable), stop=tenacity.stop_never,
        wait=tenacity.wait_exponential(multiplier=interval_s, max=max_interval_s),
        sleep=sleep, before_sleep=waiting, reraise=True)
    n = 0
    delay = interval_s
    while cycles is None or n < cycles:
        cycle = poll(monitor.poll)
        n += 1
        if on_cycle:
            on_cycle(cycle)
        if until is not None and until(cycle):
            break
        delay = interval_s if cycle.events else min(delay * 1.5, max_interval_s)
        if cycles is None or n < cycles:
            sleep(delay)
    return n
