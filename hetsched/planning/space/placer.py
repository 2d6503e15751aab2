"""The placer: per-type GPU counts -> concrete GPUs, packing onto few nodes.

A job whose counts are unchanged keeps exactly its GPUs; a job that changes
keeps what it can of its own GPUs (no data to move there) and takes the rest
best-fit by node (the node it already uses, else the smallest node that fits
the whole need, else the fullest nodes first). ``oblivious`` policies take
GPUs in cluster order, as their papers do.

A job not holding GPUs in the simulation counts the GPUs of the problem's
``prefer_gpus`` hint (replan: what it holds or waits for in Slurm now) as
its own, so a replan that gives it the same per-type counts keeps its nodes
and its Slurm job is left alone; hinted jobs are placed before the others.
"""

from __future__ import annotations

import numpy as np

from hetsched.planning.space.scorer import Evaluator


class Placer:
    """Maps per-type counts to concrete GPUs."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev
        self.hint = _hint(ev)
        self.rank = {i: k for k, i in enumerate(self.hint)}

    def place(self, counts: dict[int, np.ndarray], free: np.ndarray,
              current: dict[int, list[int]], oblivious: bool = False) -> dict[int, list[int]]:
        ev = self.ev
        free = free.copy()
        out: dict[int, list[int]] = {}
        pending: list[int] = []
        if self.hint:  # jobs holding GPUs first, then hinted ones in hint order
            current = {**{i: g for i, g in self.hint.items() if i in counts}, **current}
            counts = {i: counts[i] for i in sorted(counts, key=lambda i: (
                i not in current, self.rank.get(i, 0) if i in self.hint else 0))}
        # 1. jobs whose counts are unchanged keep exactly their GPUs
        for i, n in counts.items():
            cur = current.get(i, [])
            if cur and all(free[g] for g in cur) and self._same_counts(cur, n):
                out[i] = list(cur)
                free[cur] = False
            elif n.sum() > 0:
                pending.append(i)
        hinted = bool(self.hint)  # without a hint: by size only, as always
        pending.sort(key=lambda i: (hinted and i not in current, -int(counts[i].sum())))
        for i in pending:
            chosen: list[int] = []
            cur = current.get(i, [])
            for t, need in enumerate(counts[i]):
                need = int(need)
                if need == 0:
                    continue
                # 2. reuse this job's own GPUs of the type (no data to move there)
                mine = [g for g in cur if free[g] and ev.gpu_type[g] == t][:need]
                for g in mine:
                    free[g] = False
                chosen += mine
                need -= len(mine)
                if need:
                    got = self._take(t, need, free, oblivious,
                                     prefer_nodes={int(ev.gpu_node[g]) for g in chosen})
                    chosen += got
            out[i] = sorted(chosen)
        return out

    def _same_counts(self, gpu_ids: list[int], n: np.ndarray) -> bool:
        """Do these GPUs have exactly the per-type counts n? (Cheap: no array ops.)"""
        if len(gpu_ids) != int(n.sum()):
            return False
        types = self.ev.gpu_type_list
        need = n.tolist()
        for g in gpu_ids:
            t = types[g]
            need[t] -= 1
            if need[t] < 0:
                return False
        return True

    def _take(self, t: int, need: int, free: np.ndarray, oblivious: bool,
              prefer_nodes: set[int]) -> list[int]:
        ev = self.ev
        cand = np.nonzero(free & (ev.gpu_type == t))[0]
        if len(cand) < need:
            raise AssertionError("policy allocated more GPUs than are free")
        if oblivious:
            got = [int(g) for g in cand[:need]]
        else:
            got = self._best_fit(cand, need, prefer_nodes)
        free[got] = False
        return got

    def _best_fit(self, cand: np.ndarray, need: int, prefer_nodes: set[int]) -> list[int]:
        """Best fit by node: the node already used, else the smallest node that fits the
        whole need, else fill from the fullest nodes down (ties: lowest node index).

        Nodes are considered in the order their first candidate GPU appears; the
        counting is vectorised (thousands of GPUs per type at scale).
        """
        nodes = self.ev.gpu_node[cand]
        uniq, first, counts = np.unique(nodes, return_index=True, return_counts=True)
        seen = np.argsort(first, kind="stable")  # first-appearance order
        uniq, counts = uniq[seen], counts[seen]
        size = dict(zip(uniq.tolist(), counts.tolist(), strict=True))
        fits = [n for n, c in size.items() if c >= need]
        pref = [n for n in fits if n in prefer_nodes]
        if pref:
            order = pref[:1]
        elif fits:
            order = [min(fits, key=lambda n: (size[n], n))]
        else:
            order = sorted(size, key=lambda n: (-size[n], n))
        got: list[int] = []
        for n in order:
            got += cand[nodes == n][: need - len(got)].tolist()
            if len(got) == need:
                break
        return got


def _hint(ev: Evaluator) -> dict[int, list[int]]:
    """``problem.prefer_gpus`` as job index -> GPU ids (unknown GPUs dropped)."""
    prefer = getattr(ev.p, "prefer_gpus", None)
    if not prefer:
        return {}
    gid = {(g.node, g.index): k for k, g in enumerate(ev.p.cluster.gpus)}
    index = {job.name: i for i, job in enumerate(ev.p.jobs)}
    out: dict[int, list[int]] = {}
    for name, gpus in prefer.items():  # in the hint's order: its priority
        ids = [gid[(str(n), int(k))] for n, k in gpus if (str(n), int(k)) in gid]
        if name in index and ids:
            out[index[name]] = ids
    return out


__all__ = ["Placer"]
