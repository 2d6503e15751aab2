"""The training loop of one rank: heterogeneous data parallel with checkpoints and reports."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hetsched.io.reports import ReportWriter
from hetsched.runtime.checkpoint import load_checkpoint, restore, save_checkpoint
from hetsched.runtime.elastic import NoiseScale, Rescaler, request_path, set_lr, steps_left
from hetsched.runtime.emulate import emulation_for, link_emulation
from hetsched.runtime.launcher import RankEnv, cpu_threads
from hetsched.runtime.rendezvous import init_distributed, shutdown_distributed
from hetsched.runtime.sampler import ShareSampler, split_counts
from hetsched.runtime.step import (
    WARMUP_STEPS,
    TrainStep,
    build_step,
    process_age,
    sync_device,
)
from hetsched.runtime.workloads import load_workload


@dataclass
class TrainConfig:
    """Everything a rank needs; the same on every rank except nothing (rank comes from env)."""

    job: str
    workload: str
    dataset_size: int
    epochs: float
    local_batches: list[int]
    entrypoint: str | None = None
    #: the job's directory: its entrypoint's module is imported from there first
    workdir: str | None = None
    gpu_types: list[str] = field(default_factory=list)
    seed: int = 0
    checkpoint: str | None = None
    checkpoint_every: int = 50
    report: str | None = None
    report_every: int = 10
    #: stop after this many steps *in this run* (tests: a job killed mid-way)
    max_steps: int | None = None
    #: plain DDP averaging instead of share weighting (the biased baseline)
    average: bool = False
    device: str | None = None
    #: rank 0 saves the final parameters here (tests compare them)
    save_params: str | None = None
    #: elastic jobs (runtime/elastic.py): the rescale request file rank 0 polls
    #: (default: next to the checkpoint), the LR rule and the batch the LR was tuned at
    rescale_request: str | None = None
    lr_scaling: str = "none"
    base_batch: int | None = None

    @property
    def global_batch(self) -> int:
        return sum(self.local_batches)

    @property
    def total_steps(self) -> int:
        spe = math.ceil(self.dataset_size / self.global_batch)
        return math.ceil(self.epochs * spe - 1e-9)


def train(cfg: TrainConfig, renv: RankEnv) -> dict[str, Any]:
    """Train this rank until the job's steps are done (or ``max_steps``); returns a summary."""
    dev = init_distributed(renv, cfg.device)
    try:
        return _train(cfg, renv, dev)
    finally:
        shutdown_distributed()


def _train(cfg: TrainConfig, renv: RankEnv, dev: torch.device) -> dict[str, Any]:
    """One rank's training loop: steps, stop signals, rescales, reports, checkpoints.

    Size: one loop whose state (step, sampler position, batches, the stop and
    rescale agreements, the report accumulators) every step reads and changes;
    split into functions, each would take and return most of it.
    """
    import torch.distributed as dist

    rank = renv.rank
    if dev.type == "cpu":
        # co-located ranks share the node's cores: oversubscribed OpenMP threads
        # would make every step wait for scheduler time slices
        torch.set_num_threads(cpu_threads(_ranks_here(renv)))
    wl = load_workload(cfg.workload, entrypoint=cfg.entrypoint, dataset_size=cfg.dataset_size,
                       seed=cfg.seed, workdir=cfg.workdir)
    model = wl.model.to(dev)
    opt = wl.optimizer(model.parameters())
    sampler = ShareSampler(cfg.dataset_size, cfg.local_batches, rank, seed=cfg.seed)
    step = 0
    state = load_checkpoint(cfg.checkpoint) if cfg.checkpoint else None
    if state is not None:
        restore(state, model=model, optimizer=opt)
        sampler.load_state_dict(state["sampler"])
        step = int(state["step"])
    gpu_type = cfg.gpu_types[rank] if rank < len(cfg.gpu_types) else ""
    gns = NoiseScale()
    # the step the probe times too (runtime/step.py): batch, backward, all-reduce, optimizer
    run_step = build_step(wl, dev, average=cfg.average, emulation=emulation_for(gpu_type),
                          noise=gns, model=model, optimizer=opt)
    hdp = run_step.hdp
    hdp.link = link_emulation()
    rep = ReportWriter(cfg.report, job=cfg.job, rank=rank, workload=cfg.workload,
                   gpu_type=gpu_type, node=renv.node, world_size=renv.world_size)
    batches = list(cfg.local_batches)
    # counted from where the data is: a job rescaled before its checkpoint ran
    # other batches than these so far (cfg.total_steps when nothing was)
    total = step + steps_left(cfg.dataset_size, sum(batches), sampler.state.epoch,
                              sampler.state.offset, cfg.epochs)
    req_path = cfg.rescale_request or (str(request_path(cfg.checkpoint)) if cfg.checkpoint
                                       else None)
    base = cfg.base_batch or sum(batches)
    if cfg.lr_scaling != "none":
        set_lr(opt, cfg.lr_scaling, sum(batches), base)
    resc = Rescaler(req_path, rank, renv.world_size, cfg.lr_scaling, base)
    # Slurm sends SIGTERM before killing a step (scancel, requeue by a replan,
    # time limit): finish the current step, agree on stopping, checkpoint, exit
    stop_signal: list[int] = []
    restore_handlers = _install_stop_handlers(stop_signal)
    stopped = False
    done_here = 0
    acc = {"n": 0, "samples": 0, "t0": time.perf_counter()}
    run_t0 = epoch_t0 = time.perf_counter()
    first_step_at: float | None = None
    steady_t0: float | None = None
    epoch_steps = 0
    while step < total and (cfg.max_steps is None or done_here < cfg.max_steps):
        idx, n_global = sampler.next()
        counts = split_counts(n_global, sampler.shares)
        more = step + 1 < total and (cfg.max_steps is None or done_here + 1 < cfg.max_steps)
        nxt = sampler.peek()[0][rank] if more else None
        stopped = run_step(idx, n_global, counts=counts, stop=bool(stop_signal),
                           rescale_seq=resc.poll(), next_idx=nxt)
        if first_step_at is None:
            first_step_at = time.perf_counter()
        step += 1
        done_here += 1
        epoch_steps += 1
        acc["n"] += 1
        acc["samples"] += len(idx)
        if done_here == WARMUP_STEPS:  # the steady state starts here (as the probe's timing)
            sync_device(dev)
            steady_t0 = time.perf_counter()
        if acc["n"] >= cfg.report_every or step == total:
            _report_steps(rep, acc, run_step, batches[rank], step, gns.value, sum(batches))
        change = resc.apply(hdp.rescale_seq, sampler, opt)
        if change is not None:  # the next step runs at the new batch (or we restart)
            _report_steps(rep, acc, run_step, batches[rank], step, gns.value, sum(batches))
            if rank == 0:
                rep.write("rescale", step=step, **change)
            if change["in_place"]:
                batches = list(sampler.shares)
                total = step + steps_left(cfg.dataset_size, sum(batches), sampler.state.epoch,
                                          sampler.state.offset, cfg.epochs)
            else:
                stopped = True
        if sampler.state.offset == 0:  # an epoch just ended
            if rank == 0:
                sync_device(dev)
                el = time.perf_counter() - epoch_t0
                first, last = run_step.losses()
                rep.write("epoch", epoch=sampler.state.epoch - 1, time_s=round(el, 6),
                          steps=epoch_steps, samples_per_s=round(cfg.dataset_size / el, 3),
                          local_batches=batches, dataset_size=cfg.dataset_size,
                          loss=last, first_loss=first, gns=gns.value)
            epoch_t0 = time.perf_counter()
            epoch_steps = 0
        if cfg.checkpoint and rank == 0 and (step % cfg.checkpoint_every == 0 or step == total
                                             or stopped):
            save_checkpoint(cfg.checkpoint, model=model, optimizer=opt,
                            sampler=sampler.state_dict(), step=step,
                            extra={"local_batches": batches})
        if stopped:
            break
    restore_handlers()
    if acc["n"]:
        _report_steps(rep, acc, run_step, batches[rank], step, gns.value, sum(batches))
    sync_device(dev)
    t_end = time.perf_counter()
    steady = (round((t_end - steady_t0) / (done_here - WARMUP_STEPS), 6)
              if steady_t0 is not None and done_here > WARMUP_STEPS else None)
    if cfg.checkpoint and rank == 0 and done_here and step % cfg.checkpoint_every and not stopped:
        save_checkpoint(cfg.checkpoint, model=model, optimizer=opt, sampler=sampler.state_dict(),
                        step=step, extra={"local_batches": batches})
    wall = time.perf_counter() - run_t0
    if renv.world_size > 1:
        dist.barrier()  # rank 0's checkpoint is on disk before anyone reports success
    if rank == 0:
        first_loss, last_loss = run_step.losses()
        if cfg.save_params:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()},
                       cfg.save_params)
        rep.write("done" if step >= total else "stopped", steps=step, steps_this_run=done_here,
                  reason=("rescale" if resc.restart_needed else "signal") if stopped
                  else "max_steps" if step < total else None,
                  time_s=round(wall, 6),
                  mean_step_s=round(wall / done_here, 6) if done_here else None,
                  steady_step_s=steady, warmup_steps=WARMUP_STEPS,
                  start_to_first_step_s=_since_start(first_step_at),
                  local_batches=batches, gns=gns.value,
                  first_loss=first_loss, last_loss=last_loss)
    return {"rank": rank, "steps": step, "steps_this_run": done_here, "time_s": wall,
            "finished": step >= total, "stopped_by_signal": stopped}


def _install_stop_handlers(flag: list[int]) -> Callable[[], None]:
    """SIGTERM/SIGUSR1 -> append the signal to ``flag``; returns a function undoing it.

    Only the main thread may set handlers; elsewhere (tests) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    sigs = (signal.SIGTERM, signal.SIGUSR1)
    old = {s: signal.getsignal(s) for s in sigs}

    def on_signal(signum: int, _frame: object) -> None:
        flag.append(signum)

    for s in sigs:
        signal.signal(s, on_signal)

    def undo() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return undo


def _ranks_here(renv: RankEnv) -> int | None:
    """Ranks sharing this process's node: under Slurm, None (cpu_threads reads the
    step's tasks on this node); a local run puts all on one host."""
    return None if renv.source == "slurm" else renv.world_size


def _report_steps(rep: ReportWriter, acc: dict[str, Any], run_step: TrainStep,
                  local_batch: int, step: int, gns: float | None = None,
                  global_batch: int | None = None) -> None:
    """The window's means: its wall per step (``step_s``, one device sync per window) and
    the per-phase times of its steps (``compute_s``, ``sync_s``)."""
    n = acc["n"]
    if not n:
        return
    comp, sync = run_step.clock.flush()  # waits for the window's last step
    now = time.perf_counter()
    wall = now - acc["t0"]
    rep.write("steps", step=step, n=n, local_batch=local_batch,
              compute_s=round(comp / n, 6), sync_s=round(sync / n, 6),
              step_s=round(wall / n, 6), gns=gns, global_batch=global_batch,
              samples_per_s=round(acc["samples"] / wall, 3) if wall > 0 else None)
    acc.update(n=0, samples=0, t0=now)


def _since_start(t: float | None) -> float | None:
    """Seconds from this process's start (its creation time) to ``t`` (perf_counter)."""
    if t is None:
        return None
    age = process_age()
    return round(age - (time.perf_counter() - t), 3) if age is not None else None
