"""The online primal-dual algorithm of Zhou et al. (IEEE TPDS, "Online Scheduling Algorithm
for Heterogeneous Distributed Machine Learning Jobs"), Ring-AllReduce variant, as pure functions.

Time is slotted. Servers ``h`` are the partition's nodes, the resource types ``r``
are the GPU types (a node offers ``C_h`` GPUs of its own type and none of the
others), a type-``m`` worker is one GPU of type ``m`` (``e_m^r = 1`` iff r = m).

* :func:`price` is the price function (11), ``delta = lam**(beta/C) - 1`` with
  ``lam = 2*T*H*R*F + 1`` (:func:`lam_param`);
* :func:`alpha_bound` is Theorem 5's alpha (A_online is 4*alpha-competitive),
  :func:`alpha_round` the per-round alpha of Sec. 5.3 used in simulations, both
  with ``gamma = 2 log lam`` (Theorem 3, A_maxweight's approximation ratio);
  logarithms are base 2 (Theorem 5's ``1 + log log lam`` is ``log(2 log lam)``);
* :func:`mincost_one` / :func:`mincost_two` are A_RAmincost1 (all workers on one
  server, q=1) and A_RAmincost2 (q=0, cheapest servers first), vectorised over
  start slots and servers;
* :func:`maxweight` is A_maxweight (Algorithm 3), :func:`dual` is A_dual
  (Algorithm 2, alpha rounds of length tau, stopping early once every job is
  served) and :func:`frame_tau` gives A_online's doubling frames.

Durations come from the caller (``dur[m][phi][q]`` slots); the paper's eq. (14)
processing rate is :func:`ring_rho`. Ties between equal-cost schedules (all
prices start at 0) follow the paper's loop order by default (Algorithms 6/7
replace the incumbent only if strictly cheaper: first worker type in the
menu's order, fewest workers, earliest start, lowest server; the one-server
schedule unless the spread one is cheaper, Algorithm 3); ``ties='end'``
prefers the earliest (unrounded) end, then the fewest GPU-slots;
``ties='impact'`` the least end + GPU-slots / GPUs of the type (not in the
paper; see :mod:`.opd`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

INF = float("inf")


# ---------------------------------------------------------------- parameters
def lam_param(T: int, H: int, R: int, F: float) -> float:
    """lambda of price function (11): 2*T*H*R*F + 1."""
    return 2.0 * T * H * R * F + 1.0


def price(beta: np.ndarray | float, cap: np.ndarray | float, lam: float) -> np.ndarray:
    """Price function (11): ``lam ** (beta / C) - 1`` (0 where the capacity is 0)."""
    beta = np.asarray(beta, dtype=float)
    cap = np.asarray(cap, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(cap > 0, beta / np.where(cap > 0, cap, 1.0), 0.0)
    return np.power(lam, frac) - 1.0


def gamma_param(lam: float) -> float:
    """A_maxweight's approximation ratio, 2 log lam (Theorem 3)."""
    return 2.0 * math.log2(lam)


def alpha_round(weights: Sequence[float], gamma: float, w_min: float | None = None) -> int:
    """Per-round alpha (Sec. 5.3): floor((log w(J_i) - log w_min) / (log g - log(g-1))) + 1."""
    w = [float(x) for x in weights]
    if not w:
        return 1
    lo = min(w) if w_min is None else w_min
    den = math.log2(gamma) - math.log2(gamma - 1.0)
    return int(math.floor((math.log2(sum(w)) - math.log2(lo)) / den)) + 1


def alpha_bound(weights: Sequence[float], lam: float) -> int:
    """Theorem 5's alpha: floor((log w(J) - log w_min) / (1 + log log lam - log(2 log lam - 1))) + 1."""
    w = [float(x) for x in weights]
    L = math.log2(lam)
    den = 1.0 + math.log2(L) - math.log2(2.0 * L - 1.0)
    return int(math.floor((math.log2(sum(w)) - math.log2(min(w))) / den)) + 1


def frame_tau(i: int) -> int:
    """A_online's frame ends: tau_0 = 1, tau_i = 2**(i-1) (slots)."""
    return 1 if i <= 0 else 2 ** (i - 1)


def ring_rho(v: float, U: float, pi: float, b: float, phi: int, single: bool) -> float:
    """Eq. (14): mini-batches per slot of one worker in a Phi-worker ring."""
    red = U * (phi - 1) / phi
    comm = 0.0 if single else 2.0 * pi * (phi - 1) / (phi * b)
    return 1.0 / (v + red + comm)


# ---------------------------------------------------------------- schedules
@dataclass(frozen=True)
class JobMenu:
    """One job's options: ``dur[m][phi][q]`` slots (0/absent = infeasible)."""

    key: int
    weight: float
    dur: dict[int, dict[int, tuple[int, int]]]
    #: unrounded durations in slots, (m, phi, q) -> float, for ties (default: dur)
    exact: dict[tuple[int, int, int], float] = field(default_factory=dict)
    #: equal-cost schedules: "loop" keeps the first in the paper's loop order (types in
    #: ``dur``'s order, fewest workers, earliest start, lowest server); "end" the earliest
    #: unrounded end, then the fewest GPU-slots; "impact" the least end + GPU-slots /
    #: (GPUs of the schedule's type), the job's end plus the time its work would hold
    #: all of that type (``type_gpus``)
    ties: str = "loop"
    type_gpus: dict[int, int] = field(default_factory=dict)


@dataclass
class Choice:
    """A schedule l of one job: window [start, start+length), phi type-m workers per node y."""

    key: int
    start: int
    length: int
    m: int
    phi: int
    q: int
    y: np.ndarray
    cost: float
    exact_len: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def exact_end(self) -> float:
        return self.start + (self.exact_len or self.length)


def _tie_key(menu: JobMenu, m: int, end: float, slots: float) -> tuple[float, float]:
    if menu.ties == "impact":
        return (end + slots / max(1, menu.type_gpus.get(m, 1)), slots)
    return (end, slots)


def _better(a: Choice | None, cost: float, m: int, end: float, slots: float,
            menu: JobMenu) -> bool:
    if a is None:
        return True
    tol = 1e-9 * (1.0 + abs(a.cost))
    if cost < a.cost - tol:
        return True
    if cost > a.cost + tol or menu.ties == "loop":  # Algorithms 6/7 replace only if cheaper
        return False
    return _tie_key(menu, m, end, slots) < _tie_key(menu, a.m, a.exact_end,
                                                    a.phi * a.exact_len)


def _windows(free: np.ndarray, delta: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(min free, summed price) over every window of d slots: arrays (starts, H)."""
    wmin = sliding_window_view(free, d, axis=1).min(axis=2).T
    cs = np.concatenate([np.zeros((delta.shape[0], 1)), np.cumsum(delta, axis=1)], axis=1)
    wsum = (cs[:, d:] - cs[:, :-d]).T
    return wmin, wsum


def mincost_one(menu: JobMenu, free: np.ndarray, delta: np.ndarray,
                node_type: np.ndarray) -> Choice | None:
    """A_RAmincost1 (Algorithm 6): all phi workers on one server, cheapest window."""
    H, tau = free.shape
    best: Choice | None = None
    for m, by_phi in menu.dur.items():
        on = node_type == m
        if not on.any():
            continue
        for phi, (d, _) in sorted(by_phi.items()):
            if d <= 0 or d > tau:
                continue
            wmin, wsum = _windows(free, delta, d)
            ok = (wmin >= phi) & on[None, :]
            if not ok.any():
                continue
            cost = np.where(ok, phi * wsum, INF)
            flat = int(np.argmin(cost))  # row-major: earliest start, then lowest server
            t0, h = divmod(flat, H)
            c = float(cost[t0, h])
            x = menu.exact.get((m, phi, 1), float(d))
            if _better(best, c, m, t0 + x, phi * x, menu):
                y = np.zeros(H, dtype=int)
                y[h] = phi
                best = Choice(menu.key, t0, d, m, phi, 1, y, c, x)
    return best


def mincost_two(menu: JobMenu, free: np.ndarray, delta: np.ndarray,
                node_type: np.ndarray) -> Choice | None:
    """A_RAmincost2 (Algorithm 7): workers over servers, cheapest servers first."""
    H, tau = free.shape
    best: Choice | None = None
    for m, by_phi in menu.dur.items():
        on = node_type == m
        if on.sum() < 1:
            continue
        for phi, (_, d) in sorted(by_phi.items()):
            if d <= 0 or d > tau:
                continue
            wmin, wsum = _windows(free, delta, d)
            wmin = np.where(on[None, :], wmin, 0)
            order = np.argsort(np.where(on[None, :], wsum, INF), axis=1, kind="stable")
            fs = np.take_along_axis(wmin, order, axis=1)
            ws = np.take_along_axis(np.where(on[None, :], wsum, 0.0), order, axis=1)
            before = np.cumsum(fs, axis=1) - fs
            y = np.clip(np.minimum(fs, phi - before), 0, None)
            ok = y.sum(axis=1) >= phi
            if not ok.any():
                continue
            cost = np.where(ok, (y * ws).sum(axis=1), INF)
            t0 = int(np.argmin(cost))
            c = float(cost[t0])
            x = menu.exact.get((m, phi, 0), float(d))
            if _better(best, c, m, t0 + x, phi * x, menu):
                yy = np.zeros(H, dtype=int)
                yy[order[t0]] = y[t0]
                best = Choice(menu.key, t0, d, m, phi, 0, yy, c, x)
    return best


@dataclass
class RoundResult:
    chosen: list[Choice] = field(default_factory=list)
    lam: float = 0.0


def maxweight(menus: Sequence[JobMenu], free: np.ndarray, cap: np.ndarray,
              node_type: np.ndarray, lam: float) -> RoundResult:
    """A_maxweight (Algorithm 3) over one window of ``free.shape[1]`` slots.

    ``free`` (H, tau) is what earlier commitments leave; ``cap`` (H,) is C_h.
    Prices start at 0 (beta = 0) and follow (11) as this round allocates.
    """
    free = free.astype(int).copy()
    beta = np.zeros(free.shape)
    delta = np.zeros(free.shape)
    out = RoundResult(lam=lam)
    for menu in menus:
        c1 = mincost_one(menu, free, delta, node_type)
        c2 = mincost_two(menu, free, delta, node_type)
        best = c1
        if c2 is not None and (best is None or c2.cost < best.cost - 1e-12 * (1 + best.cost)):
            best = c2
        if best is None or menu.weight - best.cost <= 0:
            continue
        sl = slice(best.start, best.end)
        free[:, sl] -= best.y[:, None]
        beta[:, sl] += best.y[:, None]
        delta[:, sl] = price(beta[:, sl], cap[:, None], lam)
        out.chosen.append(best)
    return out


def dual(menus: Sequence[JobMenu], free: np.ndarray, cap: np.ndarray, node_type: np.ndarray,
         tau: int, alpha: int, lam: float) -> list[Choice]:
    """A_dual (Algorithm 2): alpha rounds of A_maxweight; round k fills [(k-1)tau, k*tau).

    ``free`` is (H, alpha*tau). Start slots of the result are relative to the
    schedule's beginning. Stops early once every job is served (Sec. 5.3).
    """
    left = list(menus)
    out: list[Choice] = []
    for k in range(alpha):
        if not left:
            break
        sl = slice(k * tau, (k + 1) * tau)
        res = maxweight(left, free[:, sl], cap, node_type, lam)
        for ch in res.chosen:
            ch.start += k * tau
            free[:, ch.start:ch.end] -= ch.y[:, None]
        done = {ch.key for ch in res.chosen}
        left = [mn for mn in left if mn.key not in done]
        out += res.chosen
    return out
