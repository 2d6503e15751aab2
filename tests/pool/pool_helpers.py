"""Random pool-mode instances, an independent checker and an exact MILP for tiny instances.

The checker re-derives every constraint of Hare_Sched from the plan's
expanded ``tasks`` rows alone (it shares no code with the evaluator, so a bug
there cannot hide itself), and the MILP is the textbook disjunctive model of
Hare_Sched (constraints 4-8 of the paper) solved exactly by pulp.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
from hypothesis import strategies as st

from hetsched.core.plan import Plan
from hetsched.core.pool_tasks import fused_steps
from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Job, Node
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.planning.pool.compact import expand_runs
from hetsched.planning.pool.problem import PoolProblem

TYPES = ("v100", "p100", "k80")


@st.composite
def instances(draw: Any, max_jobs: int = 5, max_iters: int = 12,
              max_gpus: int = 6) -> PlanningProblem:
    """Small heterogeneous instances: 1-3 GPU types, affine step times, sync, arrivals."""
    n_types = draw(st.integers(1, 3))
    types = TYPES[:n_types]
    counts = [draw(st.integers(1, max(1, max_gpus // n_types))) for _ in types]
    nodes = tuple(Node(f"{t}-1", t, k) for t, k in zip(types, counts, strict=True))
    cluster = Cluster(nodes=nodes, intra_node_gbps=300.0, inter_node_gbps=10.0)
    n_jobs = draw(st.integers(1, max_jobs))
    rows: list[ProfileRow] = []
    jobs: list[Job] = []
    for j in range(n_jobs):
        wl = f"w{j}"
        for t in types:
            a = draw(st.floats(0.0, 0.05))
            c = draw(st.floats(0.001, 0.02))
            sync = draw(st.floats(0.0, 0.05))
            rows += [ProfileRow(wl, t, b, a + c * b, sync) for b in (8, 64)]
        gb = draw(st.sampled_from([8, 16, 32, 64]))
        iters = draw(st.integers(1, max_iters))
        jobs.append(Job(
            name=f"j{j}", workload=wl, dataset_size=iters * gb, epochs=1, global_batch=gb,
            weight=draw(st.sampled_from([1.0, 2.0, 0.5])),
            arrival_s=draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 10.0])),
            model_size_mb=draw(st.sampled_from([0.0, 50.0])),
            requested_gpus=draw(st.integers(1, 4)),
        ))
    return PlanningProblem(jobs, cluster, ThroughputTable(rows, "<random>"))


def _iteration(p: PlanningProblem, pp: PoolProblem, i: int, t: int, b: int) -> float:
    """One executor pass of job i on type t at b samples: the profile's step (line, or
    curve where profiled so) less the optimizer's share, at least 5% of the step."""
    cv = p.curves[i][t] if p.curves[i] is not None else None
    step = p.a[i, t] + p.c[i, t] * b if cv is None else float(np.interp(b, cv[0], cv[1]))
    return max(step - float(pp.optimizer_s[i, t]), 0.05 * step)


def check_plan(pp: PoolProblem, plan: Plan, tol: float = 1e-4) -> float:
    """Assert every Hare_Sched constraint on the plan's task rows; return the recomputed objective."""
    p = pp.base
    tasks = plan.tasks
    assert tasks is not None
    jidx = {j.name: i for i, j in enumerate(p.jobs)}
    tidx = {t: k for k, t in enumerate(p.types)}
    seen: set[tuple[int, int, int]] = set()
    rounds: dict[tuple[int, int], list[tuple[Any, ...]]] = defaultdict(list)
    for g in tasks.gpus:
        rows = [row.to_list() for row in expand_runs(list(g.runs))]
        assert len(rows) == g.tasks
        t = tidx[g.gpu_type]
        prev_end = float("-inf")
        for job, r, k, start, end, sync_end, mem, _, *own in sorted(rows, key=lambda x: x[3]):
            i = jidx[job]
            assert (i, r, k) not in seen, "task scheduled twice"
            seen.add((i, r, k))
            assert start >= prev_end - tol, f"overlap on {g.node}/{g.gpu}"
            prev_end = end
            assert start >= p.arrival[i] - tol, "task before arrival"
            if own:  # the task's own batch and iterations: its step time on the profile,
                b, n = own  # its steps in passes of m slices (the plan's chunk)
                assert 1 <= b <= p.cap[i, t] and p.allowed[i, t], "batch off the GPU's cap"
                chunk = (tasks.jobs[job].chunk or {}).get(g.gpu_type)
                assert chunk is None or chunk <= p.cap[i, t], "chunk above the GPU's cap"
                m = fused_steps(chunk, b, n)
                want = (n // m) * _iteration(p, pp, i, t, m * b) + n * (
                    pp.task_overhead_s[i, t] / pp.N[i])
                if n % m:
                    want += _iteration(p, pp, i, t, (n % m) * b)
            else:
                n = pp.last[i] if r == pp.R[i] - 1 else pp.N[i]
                want = n * pp.t_it[i, t]
                # one exchange per task, whatever its iterations (the executor's)
                assert abs((sync_end - end) - pp.s_task[i, t]) <= tol, "sync time off the model"
            assert abs((end - start) - want) <= tol, "compute time off the model"
            assert mem in ("keep", "evict")
            rounds[(i, r)].append((k, start, end, sync_end, t, g.node, *own))
    uneven = any(len(v[0]) > 6 for v in rounds.values())
    if uneven:
        _check_uneven_rounds(pp, rounds, tol)
    else:
        assert len(seen) == pp.n_tasks, "tasks missing"
    obj = 0.0
    for i in range(pp.S):
        R = max(r for (j, r) in rounds if j == i) + 1
        done = [max(x[3] for x in rounds[(i, r)]) for r in range(R)]
        for r in range(1, R):
            first = min(x[1] for x in rounds[(i, r)])
            assert first >= done[r - 1] - tol, "round barrier broken"
        obj += p.weight[i] * (done[-1] - p.arrival[i])
    return obj


def _check_uneven_rounds(pp: PoolProblem, rounds: dict[tuple[int, int], list[tuple[Any, ...]]],
                         tol: float) -> None:
    """Rounds of tasks with their own batches: tasks 0..k-1, one iteration count, batches
    adding up to the global batch, the job's iterations, the worker set's sync (once per
    task: its iterations accumulate)."""
    from hetsched.core.model import comm_time

    p = pp.base
    for i in range(pp.S):
        R = max(r for (j, r) in rounds if j == i) + 1
        total = 0
        for r in range(R):
            rows = rounds[(i, r)]
            assert sorted(x[0] for x in rows) == list(range(len(rows))), "a task is missing"
            iters = {x[7] for x in rows}
            assert len(iters) == 1, "a round's tasks run different iteration counts"
            n = iters.pop()
            total += n
            assert sum(x[6] for x in rows) == p.B[i], "batches do not add up"
            types = sorted(x[4] for x in rows)
            single = len({x[5] for x in rows}) == 1
            if len(rows) == 1:
                per = 0.0
            else:
                cal = p.calibrated_comm(i, types, len(rows))
                per = cal if cal is not None else comm_time(
                    len(rows), float(p.model_mb[i]), p.bandwidth(single),
                    max(float(p.sync[i, t]) for t in types))
            for x in rows:
                assert abs((x[3] - x[2]) - per) <= tol, "sync time off the model"
        assert total == pp.total_iters[i], "the job's iterations are not all run"


def exact_optimum(pp: PoolProblem, time_limit: float = 30.0) -> float:
    """Optimal total weighted JCT of a tiny instance: disjunctive MILP of Hare_Sched (4)-(8)."""
    import pulp

    tasks = [(i, r, k) for i in range(pp.S) for r in range(int(pp.R[i])) for k in range(int(pp.P[i]))]
    G = range(pp.K)

    def tc(u: tuple[int, int, int], g: int) -> float:
        i, r, _ = u
        n = pp.last[i] if r == pp.R[i] - 1 else pp.N[i]
        return float(n * pp.t_it[i, pp.gpu_type[g]])

    def ts(u: tuple[int, int, int], g: int) -> float:
        return float(pp.s_task[u[0], pp.gpu_type[g]])

    ok = {(u, g): bool(pp.ok[u[0], pp.gpu_type[g]]) for u in tasks for g in G}
    big = float(pp.arrival.max()) + sum(
        max(tc(u, g) + ts(u, g) for g in G if ok[(u, g)]) for u in tasks)
    m = pulp.LpProblem("hare_exact", pulp.LpMinimize)
    x = {u: m.add_variable(f"x_{u[0]}_{u[1]}_{u[2]}", lowBound=float(pp.arrival[u[0]]))
         for u in tasks}
    y = {(u, g): m.add_variable(f"y_{u[0]}_{u[1]}_{u[2]}_{g}", cat="Binary")
         for u in tasks for g in G if ok[(u, g)]}
    C = [m.add_variable(f"C_{i}") for i in range(pp.S)]
    m += pulp.lpSum(float(pp.weight[i]) * (C[i] - float(pp.arrival[i])) for i in range(pp.S))
    dur = {u: pulp.lpSum(y[(u, g)] * (tc(u, g) + ts(u, g)) for g in G if ok[(u, g)])
           for u in tasks}
    for u in tasks:
        m += pulp.lpSum(y[(u, g)] for g in G if ok[(u, g)]) == 1  # (5)
        i, r, _ = u
        m += C[i] >= x[u] + dur[u]  # (6)
        if r + 1 < pp.R[i]:
            for k2 in range(int(pp.P[i])):
                m += x[(i, r + 1, k2)] >= x[u] + dur[u]  # (7)
    for a_ in range(len(tasks)):
        for b_ in range(a_ + 1, len(tasks)):
            u, v = tasks[a_], tasks[b_]
            if u[0] == v[0] and u[1] != v[1]:
                continue  # different rounds of one job are ordered by (7) already
            o = m.add_variable(f"o_{a_}_{b_}", cat="Binary")
            for g in G:  # (8) for tasks sharing GPU g
                if not (ok[(u, g)] and ok[(v, g)]):
                    continue
                both = 2 - y[(u, g)] - y[(v, g)]
                m += x[v] >= x[u] + tc(u, g) - big * (1 - o) - big * both
                m += x[u] >= x[v] + tc(v, g) - big * o - big * both
    status = m.solve(pulp.HiGHS(msg=False, timeLimit=time_limit))
    assert pulp.LpStatus[status] == "Optimal"
    return float(pulp.value(m.objective))


def tiny_instance(seed: int) -> PlanningProblem:
    """A deterministic tiny instance (at most 6 tasks) for the exact comparison."""
    rng = np.random.default_rng(seed)
    types = TYPES[: int(rng.integers(1, 3)) + 1]
    nodes = tuple(Node(f"{t}-1", t, int(rng.integers(1, 3))) for t in types)
    rows: list[ProfileRow] = []
    jobs: list[Job] = []
    budget = 6
    j = 0
    while budget > 0 and j < 3:
        P = int(rng.integers(1, 3))
        R = int(rng.integers(1, 3))
        if P * R > budget:
            P, R = 1, 1
        budget -= P * R
        wl = f"w{j}"
        for t in types:
            a, c, s = rng.uniform(0, 0.5), rng.uniform(0.01, 0.1), rng.uniform(0, 0.3)
            rows += [ProfileRow(wl, t, b, a + c * b, s) for b in (8, 64)]
        jobs.append(Job(name=f"j{j}", workload=wl, dataset_size=R * 16, epochs=1,
                        global_batch=16, weight=float(rng.choice([1.0, 2.0])),
                        arrival_s=float(rng.choice([0.0, 0.0, 1.0])), requested_gpus=P))
        j += 1
    return PlanningProblem(jobs, Cluster(nodes=nodes), ThroughputTable(rows, "<tiny>"))
