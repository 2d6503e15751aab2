"""The placer: per-type GPU counts -> concrete GPUs, packing onto few nodes.

A job whose counts are unchanged keeps exactly its GPUs; a job that changes
keeps what it can of its own GPUs (no data to move there) and takes the rest
best-fit by node (the node it already uses, else the smallest node that fits
the whole need, else the fullest nodes first). ``oblivious`` policies take
GPUs in cluster order, as their papers do.
"""

from __future__ import annotations

import numpy as np

from hetsched.planning.space.scorer import Evaluator


class Placer:
    """Maps per-type counts to concrete GPUs."""

    def __init__(self, ev: Evaluator) -> None:
        self.ev = ev

    def place(self, counts: dict[int, np.ndarray], free: np.ndarray,
              current: dict[int, list[int]], oblivious: bool = False) -> dict[int, list[int]]:
        ev = self.ev
        free = free.copy()
        out: dict[int, list[int]] = {}
        pending: list[int] = []
        # 1. jobs whose counts are unchanged keep exactly their GPUs
        for i, n in counts.items():
            cur = current.get(i, [])
            if cur and all(free[g] for g in cur) and self._same_counts(cur, n):
                out[i] = list(cur)
                free[cur] = False
            elif n.sum() > 0:
                pending.append(i)
        pending.sort(key=lambda i: -int(counts[i].sum()))
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
            by_node: dict[int, list[int]] = {}
            for g in cand:
                by_node.setdefault(int(ev.gpu_node[g]), []).append(int(g))
            # best fit: the node already used, else the smallest node that fits
            # the whole need, else fill from the fullest nodes down
            fits = [n for n, gs in by_node.items() if len(gs) >= need]
            pref = [n for n in fits if n in prefer_nodes]
            if pref:
                order = pref[:1]
            elif fits:
                order = [min(fits, key=lambda n: (len(by_node[n]), n))]
            else:
                order = sorted(by_node, key=lambda n: (-len(by_node[n]), n))
            got = []
            for n in order:
                take = by_node[n][: need - len(got)]
                got += take
                if len(got) == need:
                    break
        free[got] = False
        return got


__all__ = ["Placer"]
