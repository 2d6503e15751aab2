"""``harmony-jct``: co-location only where it lowers predicted weighted JCT.

``harmony`` (Algorithm 1) maximises utilisation (eq. (4)) and ignores JCT
and GPU types, so it loses to isolated allocation (docs/harmony.md). This
variant starts from an isolated policy's decision (``base``, default
``has``: GPU types and counts chosen for JCT) and only then co-locates: a
job the base leaves WAITING joins a job placed on one GPU type (at most two
per group, the paper's small groups) when the predicted weighted completion
of both is lower grouped than the waiting job's estimated wait plus its run
alone. The prediction: each member's seconds per iteration from eq. (1)
(``member_iteration_s``; Gavel's measured pair on one GPU wins), the pair
sharing until the first ends, the other alone afterwards; the wait is the
earliest predicted end of a placed job (when GPUs free). The pair must fit
the GPUs' memory with a 3% margin and hold both batches.

Never worse than ``base`` by construction: :func:`hetsched.planning.planner.plan_problem`
also evaluates ``base`` alone and keeps the lower weighted JCT (``fallback``;
``Plan.extra['harmony_jct']`` says which). Not in ``auto`` (opt-in).
"""

from __future__ import annotations

import numpy as np

from hetsched.core.colocation import fits_memory, member_iteration_s
from hetsched.core.memory import job_state_gb, type_memory_gb
from hetsched.core.model import BITS_PER_MB
from hetsched.core.problem import PlanningProblem
from hetsched.errors import InputError
from hetsched.planning.space.policies.base import REGISTRY, Policy, Snapshot, register
from hetsched.planning.space.policies.harmony import _Colocating

#: memory margin for a pair (the evaluator checks exactly; as ``harmony``)
MARGIN = 0.97


def step_parts(p: PlanningProblem, i: int, t: int, k: int) -> tuple[float, float]:
    """(COMP, COMM) seconds of job ``i`` on ``k`` GPUs of type ``t`` (eq. (2), ring all-reduce)."""
    comp = float(p.a[i, t] + p.c[i, t] * np.ceil(p.B[i] / k))
    if k <= 1:
        return comp, 0.0
    if p.model_mb[i] <= 0:
        return comp, float(p.sync[i, t])
    bw = p.cluster.intra_node_gbps if k <= max(1, p.node_max[t]) else p.cluster.inter_node_gbps
    return comp, float(2.0 * (k - 1) / k * p.model_mb[i] * BITS_PER_MB / (bw * 1e9))


def pair_iteration_s(p: PlanningProblem, h: int, w: int, t: int, k: int) -> list[float]:
    """Seconds per own iteration of ``h`` and ``w`` sharing ``k`` GPUs of type ``t``."""
    (ch, mh), (cw, mw) = step_parts(p, h, t, k), step_parts(p, w, t, k)
    measured = None
    if k == 1 and p.table is not None:
        bh, bw_ = int(p.B[h]), int(p.B[w])
        gt = p.types[t]
        th, tw = p.pair_step_s(h, bh, w, bw_, gt), p.pair_step_s(w, bw_, h, bh, gt)
        measured = None if th is None or tw is None else [th, tw]
    return member_iteration_s([ch, cw], [mh, mw], measured=measured)


def pair_gain(w_h: float, rem_h: float, alone_h: float, g_h: float,
              w_w: float, rem_w: float, alone_w: float, g_w: float, wait: float) -> float:
    """Predicted weighted-completion saving (> 0: group) of running a waiting job ``w``
    beside ``h`` now rather than after ``wait`` seconds, alone at ``alone_w`` s/iter.
    The pair shares until the first ends; the other then runs alone."""
    share = min(rem_h * g_h, rem_w * g_w)  # seconds both are in the group
    end_h = rem_h * g_h if rem_h * g_h <= share + 1e-12 else \
        share + (rem_h - share / g_h) * alone_h
    end_w = rem_w * g_w if rem_w * g_w <= share + 1e-12 else \
        share + (rem_w - share / g_w) * alone_w
    return w_h * (rem_h * alone_h - end_h) + w_w * (wait + rem_w * alone_w - end_w)


def _fits(p: PlanningProblem, ids: list[int], t: int, k: int, mem: np.ndarray) -> bool:
    """Both allowed on type ``t`` at ``k`` GPUs, batches within the caps, memory (3% margin)."""
    b = [float(np.ceil(p.B[i] / k)) for i in ids]
    if any(not p.allowed[i, t] or not p.lo[i] <= k <= min(p.hi[i], p.B[i])
           or bi > p.cap[i, t] for i, bi in zip(ids, b, strict=True)):
        return False
    return fits_memory([job_state_gb(p.jobs[i]) for i in ids], b,
                       [float(p.mem_cap[i, t]) for i in ids], float(mem[t]) * MARGIN)


@register
class HarmonyJct(_Colocating):
    name = "harmony-jct"
    paper = "Harmony eq. (1) on top of an isolated JCT policy"
    summary = ("Isolated base decision; a waiting job joins a running one where predicted "
               "weighted JCT drops; best of it and the base alone (opt-in)")

    def __init__(self, *, base: str = "has") -> None:
        """``base``: the isolated space policy whose decision is the start (and the fallback)."""
        super().__init__()
        cls = REGISTRY.get(base)
        if cls is None or getattr(cls, "colocates", False) or \
                getattr(cls, "decides_batch", False) or hasattr(cls, "next_wakeup"):
            ok = sorted(n for n, c in REGISTRY.items() if not getattr(c, "colocates", False)
                        and not getattr(c, "decides_batch", False)
                        and not hasattr(c, "next_wakeup"))
            raise InputError("--param", f"base must be an isolated space policy "
                             f"({', '.join(ok)}), got {base!r}")
        self.base = base
        self.inner: Policy = cls()
        for attr in ("shares", "preemptive", "placement"):
            setattr(self, attr, getattr(cls, attr))

    def fallback(self) -> Policy:
        """A fresh instance of the base policy: the isolated plan this one is compared with."""
        return REGISTRY[self.base]()

    def allocate(self, problem: PlanningProblem, snap: Snapshot) -> np.ndarray:
        p = problem
        X = np.asarray(self.inner.allocate(p, snap), dtype=int).copy()
        ids = [int(i) for i in snap.jobs]
        placed = [r for r in range(len(ids)) if X[r].sum() > 0]
        waiting = [r for r in range(len(ids)) if X[r].sum() == 0]
        hosts = [r for r in placed if np.count_nonzero(X[r]) == 1]
        alone: dict[int, float] = {}
        for r in placed:
            t = int(np.argmax(X[r]))
            c, m = step_parts(p, ids[r], t, int(X[r, t]))
            alone[r] = c + m
        ends = [snap.remaining[r] * alone[r] for r in placed]
        wait = float(min(ends)) if ends else 0.0
        mem = type_memory_gb(p.cluster, p.types)
        pairs: list[tuple[int, int]] = []
        order = sorted(waiting, key=lambda r: -p.weight[ids[r]] / max(snap.remaining[r], 1e-9))
        for w in order:
            best, gain = None, 0.0
            for h in hosts:
                t = int(np.argmax(X[h]))
                k = int(X[h, t])
                if not _fits(p, [ids[h], ids[w]], t, k, mem):
                    continue
                g_h, g_w = pair_iteration_s(p, ids[h], ids[w], t, k)
                c, m = step_parts(p, ids[w], t, k)
                d = pair_gain(p.weight[ids[h]], snap.remaining[h], alone[h], g_h,
                              p.weight[ids[w]], snap.remaining[w], c + m, g_w, wait)
                if d > gain:
                    best, gain = h, d
            if best is not None:
                X[w] = X[best]
                hosts.remove(best)
                pairs.append((best, w))
        self._name_groups([(ids[h], ids[w]) for h, w in pairs])
        return X

    def _name_groups(self, pairs: list[tuple[int, int]]) -> None:
        """Group ids for this decision, stable for a pair that was grouped before."""
        self._gid, sets = {}, {}
        for a, b in pairs:
            key = frozenset((a, b))
            gid = self._sets.get(key)
            if gid is None:
                self._count += 1
                gid = f"g{self._count}"
            sets[key] = gid
            self._gid[a] = self._gid[b] = gid
        self._sets = sets


__all__ = ["HarmonyJct", "pair_gain", "pair_iteration_s", "step_parts"]
