"""The coordinator's shared memory side: which executors get segments, and when the
names go.

An executor whose ``hello`` says it runs on the coordinator's node (:func:`.shm.same_node`)
is offered the names of its jobs' parameter segments and of a fresh gradient segment
per job (:meth:`SharedOffers._offer`); it answers with the tokens it read from each
(:meth:`SharedOffers._attach`), proving it maps the same memory, or with nothing (it
stays on TCP). A name is unlinked as soon as no one needs to open it: a GPU's gradient
segments once it answered, the parameter segments once every GPU did. The
:class:`~.coordinator.Coordinator` calls these under its lock.
"""

from __future__ import annotations

import hmac
import threading
from typing import Any

from hetsched.runtime.executor import shm
from hetsched.runtime.executor.jobserver import BadRequest, JobServer
from hetsched.runtime.executor.plan import ExecPlan


class SharedOffers:
    """Shared memory offers of the :class:`~.coordinator.Coordinator` (its state)."""

    plan: ExecPlan
    gpus: list[str]
    jobs: dict[str, JobServer]
    shared: bool
    node: dict[str, Any]
    cond: threading.Condition
    #: (GPU, job) -> the gradient segment given to that GPU's executor
    grad_segs: dict[tuple[str, str], shm.Segment]
    offered: set[str]  # GPUs offered shared memory, not answered yet
    shm_gpus: set[str]  # GPUs that proved they map the same memory
    hello: set[str]

    def unlink_segments(self) -> None:
        """Remove every shared memory segment's name (the mappings stay valid)."""
        for srv in self.jobs.values():
            if srv.seg is not None:
                srv.seg.unlink()
        for seg in list(getattr(self, "grad_segs", {}).values()):
            seg.unlink()

    def _offer(self, gpu: str, node: Any) -> dict[str, Any] | None:
        """Shared memory for ``gpu`` when its executor runs on this node: the names of its
        jobs' parameter segments and of a fresh gradient segment per job (under the lock)."""
        if not self.shared or not shm.same_node(node, self.node):
            return None
        params: dict[str, str] = {}
        grads: dict[str, str] = {}
        for name in dict.fromkeys(t.job for t in self.plan.gpus[gpu].tasks):
            srv = self.jobs[name]
            if srv.seg is None:
                continue
            key = (gpu, name)
            if key not in self.grad_segs:
                try:
                    self.grad_segs[key] = shm.Segment.create(srv.seg.nbytes)
                except shm.ShmUnavailable:
                    continue  # no room: this job's bytes go over TCP
            params[name], grads[name] = srv.seg.name, self.grad_segs[key].name
        if not params:
            return None
        self.offered.add(gpu)
        return {"params": params, "grads": grads}

    def _attach(self, gpu: str, head: dict[str, Any]) -> bool:
        """The executor's answer to the offer: the tokens it read from every segment (it
        maps the same memory) or nothing (it could not open them: TCP). Under the lock."""
        if gpu not in self.offered:
            raise BadRequest(f"GPU {gpu} answered a shared memory offer it was not made")
        self.offered.discard(gpu)
        tokens = head.get("tokens")
        ok = isinstance(tokens, dict)
        mine = {n: s for (g, n), s in self.grad_segs.items() if g == gpu}
        if ok:
            for name, seg in mine.items():
                got = tokens.get(name) if isinstance(tokens, dict) else None
                srv = self.jobs[name]
                assert srv.seg is not None
                want = srv.seg.token.hex() + seg.token.hex()
                if not isinstance(got, str) or not hmac.compare_digest(got, want):
                    ok = False
        for seg in mine.values():  # only this GPU opens these: their names can go now
            seg.unlink()
        if ok:
            self.shm_gpus.add(gpu)
        else:
            for (g, n) in [k for k in self.grad_segs if k[0] == gpu]:
                del self.grad_segs[(g, n)]
        self._unlink_when_all_attached()
        return ok

    def _unlink_when_all_attached(self) -> None:
        """Every GPU said hello and answered its offer: no one opens a name any more."""
        if set(self.gpus) <= self.hello and not self.offered:
            for srv in self.jobs.values():
                if srv.seg is not None:
                    srv.seg.unlink()
