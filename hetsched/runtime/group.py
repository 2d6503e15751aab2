"""Run a co-location group (Harmony §IV-A): several jobs on the same GPUs, subtask by subtask.

One process per shared GPU (one Slurm task each) holds every job of the group
(``group_member.Member``). Each job has its own process group
(``dist.new_group``), so its all-reduce never mixes with another job's. Every
step of a job is two subtasks:

* **COMP** on the GPU — reload if spilled, apply the last reduced gradients
  (one optimizer step), forward and backward on this rank's share — run by
  this process's main thread: one COMP at a time per GPU;
* **COMM** — the job's gradient all-reduce (and the emulated link's floor) —
  run by one communication thread per process that takes COMMs in the order
  they were queued (the same order on every rank, so two jobs' collectives
  never wait on each other crosswise), while the main thread computes the
  next job's COMP.

The loop visits the jobs round-robin: job j waits for its own COMM, steps,
computes, queues its next COMM, and the next job computes while it is in
flight. A round (every job one step) takes Harmony's eq. (1)
``max(Σ comp, Σ comm, max(comp_j + comm_j))``: the measured mean and median
are reported (``kind: group``) next to the per-job ``steps`` records.

Each job keeps the isolated runtime's semantics: share-weighted gradients
(hetdp, uneven local batches), the share sampler (every sample once per
epoch), per-job checkpoints and reports at the usual paths, stop on
SIGTERM/SIGUSR1 agreed through each job's own all-reduce.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hetsched.io.files import private_dir
from hetsched.io.reports import ReportWriter
from hetsched.runtime.emulate import emulation_for, link_emulation
from hetsched.runtime.group_member import Member
from hetsched.runtime.launcher import RankEnv, cpu_threads
from hetsched.runtime.rendezvous import init_distributed, shutdown_distributed
from hetsched.runtime.trainer import _install_stop_handlers

MIB = float(1 << 20)


@dataclass
class GroupConfig:
    """A group's jobs (one ``trainer.TrainConfig`` each, local batches in the group's
    rank order) and what the group shares."""

    group: str
    members: list[Any]
    gpu_types: list[str] = field(default_factory=list)
    device: str | None = None
    #: device memory the group's jobs may hold together (MiB); None: no limit, no spill
    memory_budget_mb: float | None = None
    #: tests: each rank writes the sample indices it trained, per job, here
    trace_dir: str | None = None


def run_group(cfg: GroupConfig, renv: RankEnv) -> dict[str, Any]:
    """This rank of the group until every job is done (or stopped); a summary."""
    dev = init_distributed(renv, cfg.device)
    try:
        return _run(cfg, renv, dev)
    finally:
        shutdown_distributed()


def _comm(flat: torch.Tensor, pg: Any, link: Any, world: int, ready: Any = None,
          stream: Any = None) -> tuple[torch.Tensor, float]:
    """A COMM subtask (the communication thread): all-reduce, then the link's floor.

    On CUDA it runs on the communication thread's own stream, after the event
    ``ready`` (the packed gradients), so the next job's kernels on the compute
    stream never wait behind it; it returns once the result is complete.
    """
    import torch.distributed as dist

    t0 = time.perf_counter()
    if world > 1:
        if stream is not None:
            stream.wait_event(ready)
            with torch.cuda.stream(stream):
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=pg)
            stream.synchronize()
        else:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=pg)
        if link is not None:
            link.pad(flat.numel() * flat.element_size(), t0)
    return flat, time.perf_counter() - t0


def _make_room(m: Member, members: list[Member], budget: float | None) -> None:
    """Reload ``m``; first spill the least recently used idle jobs while the resident
    ones and ``m`` would exceed ``budget`` bytes (dynamic reloading)."""
    if budget is not None and not m.resident:
        others = sorted((o for o in members if o is not m and o.resident),
                        key=lambda o: o.last_used)
        need = m.footprint() + sum(o.footprint() for o in others)
        while others and need > budget:
            o = others.pop(0)
            need -= o.footprint()
            o.spill()
    m.load()
    m.last_used = time.perf_counter()


def _setup(cfg: GroupConfig, renv: RankEnv, dev: torch.device) -> tuple[list[Member], str]:
    import torch.distributed as dist

    world = renv.world_size
    if dev.type == "cpu":
        torch.set_num_threads(cpu_threads(None if renv.source == "slurm" else world))
    gpu_type = cfg.gpu_types[renv.rank] if renv.rank < len(cfg.gpu_types) else ""
    members = []
    for tc in cfg.members:
        pg = dist.new_group(list(range(world))) if world > 1 else None  # same order on all
        rep = ReportWriter(tc.report, job=tc.job, rank=renv.rank, workload=tc.workload,
                       gpu_type=gpu_type, node=renv.node, world_size=world, group=cfg.group)
        members.append(Member(tc, renv.rank, dev, pg, rep))
    return members, gpu_type


def _run(cfg: GroupConfig, renv: RankEnv, dev: torch.device) -> dict[str, Any]:
    """The round-robin loop (module doc). Rounds where every job computed are timed."""
    members, gpu_type = _setup(cfg, renv, dev)
    emul, link = emulation_for(gpu_type), link_emulation()
    budget = cfg.memory_budget_mb * MIB if cfg.memory_budget_mb is not None else None
    stop_signal: list[int] = []
    undo = _install_stop_handlers(stop_signal)
    net = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetsched-comm")
    comm_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
    rounds: list[tuple[float, bool]] = []  # (start, every job computed in it)
    t_start = time.perf_counter()
    try:
        for m in members:
            m.done = m.step >= m.total
        while any(not m.done for m in members):
            r0, computed = time.perf_counter(), 0
            for m in members:
                if m.done:
                    continue
                t_load = time.perf_counter()
                _make_room(m, members, budget)
                t0 = time.perf_counter()
                m.acc["reload"] += t0 - t_load  # reported apart: COMP is the job's own work
                if m.future is not None:
                    t_wait = time.perf_counter()
                    flat, comm_s = m.future.result()
                    t0 += time.perf_counter() - t_wait  # waiting is no part of COMP
                    m.future = None
                    stop_any = m.apply(flat)
                    m.comp_s += time.perf_counter() - t0
                    m.finish_step(comm_s, time.perf_counter())
                    limit = m.cfg.max_steps is not None and m.done_here >= m.cfg.max_steps
                    if stop_any or limit or m.step >= m.total:
                        m.done, m.stopped = True, stop_any
                        if renv.rank == 0 and m.cfg.checkpoint and \
                                m.step % m.cfg.checkpoint_every and m.step < m.total:
                            m.checkpoint()
                        continue
                    t0 = time.perf_counter()
                flat = m.compute(bool(stop_signal), emul, cfg.trace_dir is not None)
                m.comp_s += time.perf_counter() - t0
                ready = None
                if comm_stream is not None:
                    ready = torch.cuda.Event()
                    ready.record()
                m.future = net.submit(_comm, flat, m.pg, link, renv.world_size, ready,
                                      comm_stream)
                computed += 1
            rounds.append((r0, computed == len(members)))
    finally:
        net.shutdown(wait=True)
        undo()
    return _finish(cfg, renv, members, rounds, time.perf_counter() - t_start)


def round_times(rounds: list[tuple[float, bool]]) -> list[float]:
    """Seconds of each round in which, like the next one, every job computed (the first
    round, which starts every job cold, is left out)."""
    return [rounds[k + 1][0] - rounds[k][0] for k in range(1, len(rounds) - 1)
            if rounds[k][1] and rounds[k + 1][1]]


def _finish(cfg: GroupConfig, renv: RankEnv, members: list[Member],
            rounds: list[tuple[float, bool]], wall: float) -> dict[str, Any]:
    import torch.distributed as dist

    for m in members:
        m.report_steps()
    if cfg.trace_dir:
        private_dir(cfg.trace_dir)
        for m in members:
            (Path(cfg.trace_dir) / f"{m.cfg.job}-r{renv.rank}.json").write_text(
                json.dumps(m.trace))
    if renv.world_size > 1:
        dist.barrier()  # every checkpoint is on disk before anyone reports success
    times = round_times(rounds)
    n = len(times)
    it_s = sum(times) / n if n else None
    med_s = statistics.median(times) if n else None
    if renv.rank == 0:
        for m in members:
            if m.cfg.save_params:
                torch.save(m.params_cpu(), m.cfg.save_params)
            m.rep.write("group", jobs=[o.cfg.job for o in members], rounds=n,
                        iteration_s=round(it_s, 6) if it_s is not None else None,
                        iteration_median_s=round(med_s, 6) if med_s is not None else None,
                        spills=m.spills, reloads=m.reloads)
            finished = m.step >= m.total
            m.rep.write("done" if finished else "stopped", steps=m.step,
                        steps_this_run=m.done_here, time_s=round(wall, 6),
                        reason=None if finished else "signal" if m.stopped else "max_steps",
                        mean_step_s=round(wall / m.done_here, 6) if m.done_here else None,
                        local_batches=list(m.cfg.local_batches),
                        first_loss=m.losses[0] if m.losses else None,
                        last_loss=m.losses[-1] if m.losses else None)
    return {"rank": renv.rank, "group": cfg.group, "time_s": wall,
            "group_iteration_s": it_s, "group_iteration_median_s": med_s, "rounds_timed": n,
            "jobs": {m.cfg.job: {"steps": m.step, "finished": m.step >= m.total,
                                 "stopped_by_signal": m.stopped, "spills": m.spills,
                                 "reloads": m.reloads} for m in members}}
