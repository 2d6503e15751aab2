"""``hetsched exec``: this process's GPU, the coordinator (rank 0), and ``--local`` mode.

In a Slurm step ``srun`` starts one task per pool GPU across the heterogeneous
job's components. This task's place comes from the same environment as
``hetsched run``'s (:func:`hetsched.runtime.launcher.from_env`: ``SLURM_PROCID``,
``SLURM_STEP_NUM_TASKS``/``SLURM_NTASKS``, the rank-0 node from
``SLURM_JOB_NODELIST_HET_GROUP_0`` / ``SLURM_STEP_NODELIST``, the port derived from
``SLURM_JOB_ID``/``SLURM_STEP_ID``/``SLURM_CLUSTER_NAME``, overridden by
``HETSCHED_MASTER_ADDR``/``HETSCHED_MASTER_PORT``; ``RANK``/``WORLD_SIZE``/
``MASTER_ADDR``/``MASTER_PORT`` outside Slurm). Its GPU is
``HETSCHED_POOL_GPUS`` (plan GPU ids, comma-separated, in ``SLURM_PROCID`` order)
``[rank]``, else the plan's GPU order; ``--gpu`` overrides. Rank 0 also runs the
coordinator on the rendezvous port (rank 0 listens, every executor, rank 0's
own included, connects to it). The coordinator listens on the rendezvous
address only (the address of the plan's first node, 127.0.0.1 for ``--local``),
and every connection proves the pool job's key: the file ``--key-file``
(``HETSCHED_POOL_KEY_FILE``) that ``hetsched submit`` wrote, 0600, in the
submission's private folder (io/jobfiles.py); ``--local`` makes a fresh key in memory for its processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetsched.errors import HetschedError, InputError
from hetsched.io.plan_json import load_plan
from hetsched.io.pool_reports import report_path
from hetsched.io.reports import ReportWriter
from hetsched.runtime.environment import KEY_FILE_VAR, POOL_GPUS_VAR, JobEnvironment
from hetsched.runtime.executor.plan import ExecPlan, exec_plan
from hetsched.runtime.launcher import free_port, run_then_exit

#: exit status of an executor whose pool job failed (distinct from input errors' 2)
FAILED_EXIT = 3


class ExecFailed(HetschedError):
    """The pool job failed; every executor exits with this one line."""

    exit_code = FAILED_EXIT

    def __init__(self, gpu: str, why: str) -> None:
        super().__init__(f"exec GPU {gpu}: pool job failed: {why}; rounds after the last "
                         "checkpoint are lost; `hetsched replan` plans the remaining tasks")


def executor_gpus(xplan: ExecPlan, jenv: JobEnvironment) -> list[str]:
    """The GPU ids of the step's executors, in rank order."""
    raw = ",".join(jenv.pool_gpus)
    ids = list(jenv.pool_gpus) or [g for g, d in xplan.gpus.items() if d.tasks]
    unknown = [g for g in ids if g not in xplan.gpus]
    if unknown:
        raise InputError(POOL_GPUS_VAR, f"GPU {unknown[0]!r} is not in the plan (plan GPUs: "
                         f"{', '.join(xplan.gpus)})")
    if len(set(ids)) != len(ids):
        raise InputError(POOL_GPUS_VAR, f"{raw!r} names a GPU twice")
    return ids


def _device(name: str | None, local_id: int) -> Any:
    import torch

    if name == "cuda" or (name is None and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise InputError("--device", "cuda asked for, but torch sees no GPU")
        dev = torch.device("cuda", local_id % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        torch.randn(1, device=dev)  # the context now, not in the first task
        return dev
    return torch.device("cpu")


def pool_key(opts: Mapping[str, Any], jenv: JobEnvironment) -> bytes:
    """The pool job's key: ``opts["key"]`` (``--local``'s own), else the key file."""
    from hetsched.io.secret import read_secret

    if opts.get("key"):
        return bytes(opts["key"])
    path = opts.get("key_file") or jenv.key_file
    if not path:
        raise InputError("--key-file", "no pool job key: `hetsched submit` passes the key "
                         f"file it wrote (--key-file, ${KEY_FILE_VAR}); outside Slurm use "
                         "`hetsched exec --local`")
    return read_secret(path)


def load_exec_plan(plan_path: str) -> ExecPlan:
    """The pool plan an executor runs, refused when another user could have written it."""
    from hetsched.io.files import check_private

    check_private(plan_path, "pool plan")
    return exec_plan(load_plan(plan_path), plan_path)


def bind_address(addr: str) -> str:
    """The one address the coordinator listens on: the rendezvous address (an IPv4
    address, or a name resolved the way the executors resolve it)."""
    import socket

    try:
        return str(socket.getaddrinfo(addr, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return addr


def run_rank(plan_path: str, opts: dict[str, Any], env: Mapping[str, str] | None = None
             ) -> dict[str, Any]:
    """This process's executor (and rank 0's coordinator). Raises ExecFailed on failure."""
    import torch

    from hetsched.runtime.launcher import cpu_threads

    jenv = JobEnvironment.from_env(env)
    env = jenv.env
    xplan = load_exec_plan(plan_path)
    key = pool_key(opts, jenv)
    renv = jenv.rank
    gpus = executor_gpus(xplan, jenv)
    if renv.world_size != len(gpus):
        raise InputError(POOL_GPUS_VAR, f"{len(gpus)} executor GPUs for {renv.world_size} "
                         "tasks; start one task per pool GPU (or use --local)")
    gid = opts.get("gpu") or gpus[renv.rank]
    if gid not in xplan.gpus:
        raise InputError("--gpu", f"{gid!r} is not a GPU of the plan ({', '.join(xplan.gpus)})")
    dev = _device(opts.get("device"), jenv.local_id)
    if dev.type == "cpu":
        torch.set_num_threads(int(opts.get("threads") or cpu_threads(len(gpus) if opts.get(
            "local") else None, env)))
    return run_gpu(xplan, gid, gpus, renv.rank == 0, renv.master_addr,
                   renv.master_port or free_port(), key, dev, opts, env)


#: seconds the coordinator waits for every executor to connect (they connect right
#: after start, before building their models)
CONNECT_TIMEOUT_S = 120.0


def run_gpu(xplan: ExecPlan, gid: str, gpus: list[str], rank0: bool, addr: str, port: int,
            key: bytes, dev: Any, opts: dict[str, Any], env: Mapping[str, str] | None = None,
            coord_box: list[Any] | None = None) -> dict[str, Any]:
    """One executor (with the coordinator when ``rank0``) on an explicit rendezvous;
    ``key`` is the pool job's secret."""
    from hetsched.runtime.emulate import emulation_for
    from hetsched.runtime.executor import protocol, shm
    from hetsched.runtime.executor.worker import ExecOptions, Executor, PoolFailed

    transport = shm.transport(opts, os.environ if env is None else env)
    coord = None
    if rank0:
        from hetsched.runtime.executor.coordinator import Coordinator

        ckpt = Path(opts["checkpoint_dir"]) if opts.get("checkpoint_dir") else None
        host = bind_address(addr)
        try:
            listener = protocol.listen(host, port)
        except OSError as e:
            raise ExecFailed(gid, f"the coordinator cannot listen on {host}:{port} "
                             f"({e.strerror}); set HETSCHED_MASTER_ADDR to this node's "
                             "address and HETSCHED_MASTER_PORT to a free port") from None
        try:
            coord = Coordinator(xplan, gpus, listener, key, ckpt,
                                seed=int(opts.get("seed") or 0),
                                hello_timeout_s=float(opts.get("hello_timeout_s")
                                                      or CONNECT_TIMEOUT_S),
                                ckpt_every_s=float(opts.get("checkpoint_every_s") or 0.0),
                                idle_timeout_s=opts.get("idle_timeout_s"),
                                transport=transport)
        except BaseException:
            listener.close()
            raise
        if coord_box is not None:
            coord_box.append(coord)
    gpu = xplan.gpus[gid]
    rep = ReportWriter(report_path(opts["report_dir"], xplan.plan_id, gid)
                   if opts.get("report_dir") else None)
    eo = ExecOptions(dev, seed=int(opts.get("seed") or 0),
                     residency=bool(opts.get("residency", True)),
                     average=bool(opts.get("average", False)),
                     emulation=emulation_for(gpu.gpu_type, env), on_task=opts.get("on_task"),
                     transport=transport,
                     connect=None if opts.get("in_line") else (
                         lambda channel: protocol.connect(addr, port, key, gid,
                                                          channel=channel)))
    try:
        conn = protocol.connect(addr, port, key, gid)
        try:
            ran = Executor(xplan, gpu, conn, rep, eo).run()
        finally:
            conn.close()
    except (PoolFailed, protocol.PeerLost) as e:
        if coord is not None:
            coord.fail(str(e))
            coord.close()
        raise ExecFailed(gid, str(e)) from None
    except BaseException:
        if coord is not None:  # nothing of the pool job stays in /dev/shm
            coord.close()
        raise
    if coord is not None:
        why = coord.wait_done()
        coord.close()
        if why is not None:
            raise ExecFailed(gid, why)
    return {"gpu": gid, "tasks": ran}


def run_threads(plan_path: str, opts: dict[str, Any], device: str = "cpu"
                ) -> list[dict[str, Any] | BaseException]:
    """Every executor as a thread of this process (tests, benchmarks): the same
    coordinator and TCP protocol, without process starts. Results in rank order."""
    import threading
    import time as _time

    import torch

    from hetsched.io.secret import new_secret

    xplan = load_exec_plan(plan_path)
    gpus = executor_gpus(xplan, JobEnvironment())
    port = free_port()
    key = new_secret()
    dev = torch.device(device)
    out: list[dict[str, Any] | BaseException] = [RuntimeError("did not finish")] * len(gpus)
    box: list[Any] = []

    def one(rank: int) -> None:
        try:
            out[rank] = run_gpu(xplan, gpus[rank], gpus, rank == 0, "127.0.0.1", port,
                                key, dev, opts, coord_box=box)
        except BaseException as e:  # noqa: BLE001  (reported to the caller)
            out[rank] = e

    threads = [threading.Thread(target=one, args=(0,))]
    threads[0].start()
    while not box and threads[0].is_alive():
        _time.sleep(0.01)  # rank 0 listens before the others connect
    threads += [threading.Thread(target=one, args=(r,)) for r in range(1, len(gpus))]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join()
    return out


def _local_child(plan_path: str, opts: dict[str, Any], rank: int, world: int, port: int,
                 gpus: list[str]) -> None:
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        del os.environ[k]  # a local run inside a Slurm job must not read Slurm's layout
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       POOL_GPUS_VAR: ",".join(gpus)})
    run_then_exit(run_rank, (plan_path, opts))


def start_local(plan_path: str, opts: dict[str, Any]) -> list[Any]:
    """Start every GPU's executor as a local process (spawn); returns the processes.

    They share a fresh key, handed to each through the spawn pipe (never the
    command line or the environment)."""
    from hetsched.io.secret import new_secret

    xplan = load_exec_plan(plan_path)
    gpus = executor_gpus(xplan, JobEnvironment.from_env())
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = []
    opts = {**opts, "key": new_secret()}
    for r in range(len(gpus)):
        p = ctx.Process(target=_local_child, args=(plan_path, opts, r, len(gpus), port, gpus),
                        name=f"exec-{gpus[r]}")
        p.start()
        procs.append(p)
    return procs


def run_local(plan_path: str, opts: dict[str, Any], timeout_s: float = 3600.0) -> list[int]:
    """``--local``: every executor as a local process; their exit codes (rank order).

    Unlike ``spawn_local`` a failed executor does not stop the others: they
    notice through the coordinator and exit with their own line.
    """
    procs = start_local(plan_path, opts)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(5)
    return [p.exitcode if p.exitcode is not None else -9 for p in procs]


def with_default_dirs(opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with the report and checkpoint roots filled in (io/jobfiles.py); the
    executors write a level below, per plan id."""
    from hetsched.io.jobfiles import checkpoint_root, report_root

    out = dict(opts)
    out["report_dir"] = str(opts.get("report_dir") or report_root())
    out["checkpoint_dir"] = str(opts.get("checkpoint_dir") or checkpoint_root())
    return out
