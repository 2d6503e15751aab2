"""Where HAS's placement differs from exhaustive's, and whether the step-time curves cause it.

    python bench/has_vs_exhaustive.py        # ~30 s on the 2-core VM

1. Scenario A of bench_planner.py at K=30, one placement at t=0, on the
   piecewise step-time curves and with the planner's curves removed (the
   affine line; synchronisation calibrated as before): allocations,
   objectives, the per-job times behind the difference, and whether any of
   HAS's categories (either matching) reaches exhaustive's allocation.
2. The bundled example (``make demo``'s inputs), curves and line: the whole
   plan of has and exhaustive, and at every reset event of HAS's timeline
   both policies' predicted weighted remaining time for that same snapshot.
3. JPS (N=40) at K=300 against exhaustive at K=60 (a sub-cluster: an upper
   bound on the K=300 optimum).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_planner import PAPER_JOBS, TABLE, cluster, first_placement  # noqa: E402

import hetsched.planning.space.policies.has as has_mod  # noqa: E402
from hetsched.core.problem import PlanningProblem  # noqa: E402
from hetsched.io.profiles import load_throughputs  # noqa: E402
from hetsched.io.specs import load_cluster, load_jobs, parse_jobs  # noqa: E402
from hetsched.planning.space.evaluator import simulate  # noqa: E402
from hetsched.planning.space.policies.base import Snapshot, make_policy  # noqa: E402
from hetsched.planning.space.policies.common import admit, smith_priority  # noqa: E402
from hetsched.planning.space.policies.has import HAS, CategorySolver  # noqa: E402
from hetsched.planning.space.policies.sampling import bounded_compositions  # noqa: E402


def objective(p: PlanningProblem, snap: Snapshot, X: np.ndarray) -> float:
    return float(sum(p.weight[i] * snap.remaining[r] * p.iter_time(int(i), X[r][None])[0]
                     for r, i in enumerate(snap.jobs) if X[r].sum()))


def start(p: PlanningProblem) -> Snapshot:
    S = p.S
    return Snapshot(t=0.0, jobs=np.arange(S), remaining=p.iters.copy(), free=p.n_type.copy(),
                    current=np.zeros((S, p.T), dtype=int), waited=np.zeros(S))


def scenario_a(line: bool) -> None:
    p = PlanningProblem(parse_jobs(PAPER_JOBS, "bench"), cluster(30), TABLE)
    if line:
        p.curves = [None] * p.S
        p.clear_caches()
    snap = start(p)
    print(f"\n== A, K=30, {'affine line' if line else 'piecewise curves'}; types {p.types}")
    got = {}
    for name in ("exhaustive", "has"):
        X = make_policy(name).allocate(p, snap)
        got[name] = X
        per = [round(float(p.weight[i] * p.iters[i] * p.iter_time(i, X[i][None])[0]), 1)
               for i in range(p.S)]
        print(f"{name:10s} {objective(p, snap, X):9.1f}  counts {X.tolist()}  per job {per}")
    rows, _ = admit(p, snap, smith_priority(p, snap))
    sol = CategorySolver(p, snap, rows, "both", True)
    cats = list(bounded_compositions(sol.total, sol.lo.tolist(), sol.hi.tolist()))
    target = got["exhaustive"][rows]
    for norm in (False, True):
        A = np.array([sol._match(np.asarray(c), norm) for c in cats])
        dom = sum(bool((a >= target).all()) for a in A)
        sol._objective(A)  # trims A in place
        hit = sum(bool((a == target).all()) for a in A)
        print(f"matching {'normalized' if norm else 'raw':10s}: {len(cats)} categories, "
              f"{dom} matched allocations contain exhaustive's, {hit} trim to it")
    names = [p.jobs[i].name for i in sol.jobs]
    tab = sol._rates(False)
    sizes = tuple(int(v) for v in target.sum(axis=1))
    big = list(sizes)
    big[-1] = sol.total - sum(sizes[:-1])
    print(f"raw worths (samples/s per GPU, {p.types}) at category {tuple(big)} ({names}):")
    for j, k in enumerate(big):
        print(f"  {names[j]:12s} {np.round(tab[j, k], 1).tolist()}")


def example(line: bool) -> None:
    ex = ROOT / "examples"
    p = PlanningProblem(load_jobs(ex / "jobs.yaml"), load_cluster(ex / "cluster.yaml"),
                        load_throughputs(ex / "gavel_throughputs.csv"))
    if line:
        p.curves = [None] * p.S
    events: list[str] = []

    class Logged(HAS):
        def allocate(self, problem, snap):  # type: ignore[no-untyped-def]
            X = super().allocate(problem, snap)
            E = make_policy("exhaustive").allocate(problem, snap)
            a, b = objective(problem, snap, X), objective(problem, snap, E)
            events.append(f"  t={snap.t:7.1f} jobs {[problem.jobs[i].name for i in snap.jobs]}"
                          f" has {a:.1f} exhaustive {b:.1f} ({a / b - 1:+.2%})")
            if a > b * (1 + 1e-9):
                events.append(f"    has {X.tolist()}\n    ex  {E.tolist()}")
            return X

    print(f"\n== bundled example, {'affine line' if line else 'piecewise curves'}; "
          f"types {p.types}")
    for name in ("exhaustive", "has"):
        p.clear_caches()
        print(f"{name:10s} whole plan {simulate(p, make_policy(name)).weighted_jct_s:.1f} s")
    p.clear_caches()
    simulate(p, Logged())
    print("HAS's reset events, both policies on the same snapshot:")
    print("\n".join(events))


def jps_scale() -> None:
    jobs = parse_jobs(PAPER_JOBS, "bench")
    print("\n== JPS N=40 with K, against exhaustive at K=60 (sub-cluster of K=300)")
    for k in (60, 300):
        p = PlanningProblem(jobs, cluster(k), TABLE)
        row = f"K={k}: jps {first_placement(p, 'jps', samples=40)[1]:.1f}"
        if k == 60:
            row += f", exhaustive {first_placement(p, 'exhaustive')[1]:.1f}"
        else:  # the exact trim table instead of the local search (lattice of 101^3)
            limit, has_mod.TRIM_TABLE_MAX = has_mod.TRIM_TABLE_MAX, 2_000_000
            try:
                row += f", with the exact trim {first_placement(p, 'jps', samples=40)[1]:.1f}"
            finally:
                has_mod.TRIM_TABLE_MAX = limit
        print(row)


if __name__ == "__main__":
    scenario_a(line=False)
    scenario_a(line=True)
    example(line=False)
    example(line=True)
    jps_scale()
