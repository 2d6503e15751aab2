"""Where this process sits in the job: rank, world, rendezvous, device, local batch.

Inside one Slurm step that spans several heterogeneous-job components
(``srun --het-group=0,1,...``) Slurm numbers the tasks across components:
``SLURM_PROCID`` is the global rank and ``SLURM_NTASKS`` /
``SLURM_STEP_NUM_TASKS`` the total (checked on Slurm 22.05), ``SLURM_LOCALID``
the rank on its node, and ``SLURM_JOB_NODELIST_HET_GROUP_0`` the node of
component 0, where rank 0 runs (each hetsched component is one node). The
rendezvous address is that node (``SLURM_STEP_NODELIST``'s first node for a
plain job); node names that do not resolve (the testbed's fake nodes) fall
back to ``SLURM_LAUNCH_NODE_IPADDR``, the node srun was started from, which
for a batch script is that same first node. The port is derived from the job
and step id so concurrent jobs on one node do not collide;
``HETSCHED_MASTER_ADDR`` / ``HETSCHED_MASTER_PORT`` override both.

Outside Slurm, ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` (torchrun
style, and what :func:`spawn_local` sets) are used; with neither, one process.

Parsing is torch-free; joining the process group is runtime/rendezvous.py.
"""

from __future__ import annotations

import atexit
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import hostlist

from hetsched import config
from hetsched.errors import HetschedError, InputError

#: rendezvous ports: below Linux's ephemeral range (32768+) and above the
#: testbed's Slurm port blocks (10000-29999)
PORT_BASE = 30000
PORT_SPAN = 2700


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    node: str
    master_addr: str
    master_port: int
    job_id: str = ""
    source: str = "single"  # slurm | env | single


def derive_port(job_id: str, step_id: str = "0", cluster: str = "") -> int:
    """A rendezvous port from the Slurm job and step ids (same on every rank).

    The cluster name is mixed in because several test clusters on one host
    (testbeds) each number their jobs from 1.
    """
    try:
        j, s = int(job_id), int(step_id or 0)
    except ValueError:
        j, s = zlib.crc32(job_id.encode()), 0
    c = zlib.crc32(cluster.encode()) if cluster else 0
    return PORT_BASE + (j * 7 + s * 131 + c) % PORT_SPAN


def _int(env: Mapping[str, str], key: str, minimum: int = 0) -> int:
    raw = env.get(key, "")
    try:
        v = int(raw)
    except ValueError:
        raise InputError("environment", f"{key}={raw!r} is not an integer") from None
    if v < minimum:
        raise InputError("environment", f"{key}={v} must be >= {minimum}")
    return v


def _resolve(host: str) -> str | None:
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    except (OSError, IndexError):
        return None


def _first_node(nodelist: str) -> str:
    try:
        nodes = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist:
        raise InputError("environment", f"cannot parse Slurm node list {nodelist!r}") from None
    return nodes[0] if nodes else ""


def from_env(env: Mapping[str, str] | None = None) -> RankEnv:
    """Read the rank layout from Slurm's (or torchrun's) environment."""
    env = os.environ if env is None else env
    addr_override = env.get(config.SETTINGS["master_addr"].env)
    port_var = config.SETTINGS["master_port"].env
    port_override = _int(env, port_var, 1) if env.get(port_var) else None
    if "SLURM_PROCID" in env and ("SLURM_STEP_NUM_TASKS" in env or "SLURM_NTASKS" in env):
        rank = _int(env, "SLURM_PROCID")
        world = _int(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env
                     else "SLURM_NTASKS", 1)
        if rank >= world:
            raise InputError("environment", f"SLURM_PROCID={rank} is not below the task "
                             f"count {world}")
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        node = env.get("SLURMD_NODENAME", "") or socket.gethostname()
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID", "0")
        rank0_list = (env.get("SLURM_JOB_NODELIST_HET_GROUP_0") if env.get("SLURM_HET_SIZE")
                      else None) or env.get("SLURM_STEP_NODELIST") or env.get(
                          "SLURM_JOB_NODELIST", "")
        rank0_node = _first_node(rank0_list) if rank0_list else node
        addr = addr_override or _resolve(rank0_node) or env.get(
            "SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
        port = port_override or derive_port(job_id, env.get("SLURM_STEP_ID")
                                            or env.get("SLURM_STEPID", "0"),
                                            env.get("SLURM_CLUSTER_NAME", ""))
        return RankEnv(rank, world, local, node, addr, port, job_id, "slurm")
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
        if rank >= world:
            raise InputError("environment", f"RANK={rank} is not below WORLD_SIZE={world}")
        local = _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        port = port_override or (_int(env, "MASTER_PORT", 1) if "MASTER_PORT" in env else 29500)
        return RankEnv(rank, world, local, socket.gethostname(),
                       addr_override or env.get("MASTER_ADDR", "127.0.0.1"), port, "", "env")
    return RankEnv(0, 1, 0, socket.gethostname(), "127.0.0.1", port_override or 0, "", "single")


def local_batches_for(world_size: int, env: Mapping[str, str] | None = None,
                      plan_batches: Sequence[int] | None = None,
                      source: str = "HETSCHED_LOCAL_BATCHES") -> list[int]:
    """Every rank's local batch: ``HETSCHED_LOCAL_BATCHES`` (set by the hetjob template)
    or the plan's workers in the template's rank order; must match the world size."""
    env = os.environ if env is None else env
    raw = env.get("HETSCHED_LOCAL_BATCHES", "")
    if raw:
        try:
            batches = [int(x) for x in raw.split(",")]
        except ValueError:
            raise InputError(source, f"{raw!r} is not a comma-separated list of integers"
                             ) from None
    elif plan_batches is not None:
        batches = list(plan_batches)
    else:
        raise InputError(source, "no local batches: set HETSCHED_LOCAL_BATCHES or give --plan")
    if len(batches) != world_size:
        raise InputError(source, f"{len(batches)} local batches for {world_size} ranks; the "
                         "step must run one task per planned worker")
    if any(b < 1 for b in batches):
        raise InputError(source, f"every local batch must be >= 1, got {batches}")
    return batches


def cpu_threads(ranks_on_node: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """Intra-op threads for a CPU rank: its share of the cores it may run on.

    Slurm may pin a task to fewer cores than the node has; torch's default
    (one thread per core of the node) then puts several spinning OpenMP
    threads on one core, and each step waits for the scheduler's time slices
    (measured: 0.1 s per step instead of 0.03 s on the testbed).

    ``ranks_on_node``: the ranks sharing this node's cores; None: under Slurm, this
    step's tasks on this node (:func:`step_tasks_here`), else 1. Where the task's
    affinity spans the job's CPUs on the node (``SLURM_CPUS_ON_NODE``; no per-task
    binding, or none at all), those CPUs are split between the ranks; two ranks each
    taking all of them ran 4-9x slower a step on the testbed, where a rank's thread
    spun while the other's held the core. A task bound to cores of its own (fewer than
    the machine has) keeps them. A node that claims more CPUs than the machine has
    (the testbed's, or an oversubscribed one) leaves the task every core: its ranks
    split those.
    """
    env = os.environ if env is None else env
    machine = os.cpu_count() or 1
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = machine
    ranks = max(1, ranks_on_node if ranks_on_node is not None else step_tasks_here(env) or 1)
    on_node = env.get("SLURM_CPUS_ON_NODE", "")
    cpus = int(on_node) if on_node.isdigit() and int(on_node) > 0 else None
    if cpus is not None and allowed >= cpus:
        n = max(1, cpus // ranks)  # the job's CPUs here, shared by its ranks here
    elif cpus is not None and allowed < machine:
        n = allowed  # bound to its own cores
    else:
        n = max(1, allowed // ranks) if allowed > 1 else 1
    per_task = env.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        n = min(n, int(per_task))
    # an explicit OpenMP cap wins (Slurm 22.05 does not pass --cpus-per-task of a
    # hetjob to its step's tasks, so SLURM_CPUS_PER_TASK is often unset)
    omp = env.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return max(1, n)


def step_tasks_here(env: Mapping[str, str]) -> int | None:
    """This Slurm step's tasks on this node (``SLURM_STEP_TASKS_PER_NODE``, e.g. "2(x3),1",
    over ``SLURM_STEP_NODELIST``; a hetjob step lists every component's nodes), or None
    outside a step or where they do not match."""
    per, nodes, me = (env.get(k, "") for k in ("SLURM_STEP_TASKS_PER_NODE",
                                              "SLURM_STEP_NODELIST", "SLURMD_NODENAME"))
    if not (per and nodes and me):
        return None
    try:
        counts = hostlist.parse_slurm_tasks_per_node(per)
        names = hostlist.expand_hostlist(nodes)
    except (hostlist.BadHostlist, ValueError):
        return None
    if len(counts) != len(names) or me not in names:
        return None
    return int(counts[names.index(me)])


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a local rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stopped(HetschedError):
    """``run --local`` got SIGTERM or SIGINT; its ranks were told and have exited."""

    def __init__(self, signum: int, codes: list[int]) -> None:
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}: forwarded to {len(codes)} local ranks, which "
                         f"exited with {codes} (a checkpoint was written if one was configured)")


#: seconds the ranks get to finish a step and checkpoint after a forwarded signal
STOP_GRACE_S = 60.0


def _die_with_parent(parent: int) -> None:
    """Linux: SIGTERM this rank when the launcher dies, even by SIGKILL (no orphans)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(128 + signal.SIGTERM)


def _child(rank: int, world: int, port: int, extra_env: Mapping[str, str],
           target: Callable[..., Any], args: tuple[Any, ...], parent: int = 0) -> None:
    if parent:
        _die_with_parent(parent)
        # Ctrl-C reaches the whole process group; the launcher turns it into SIGTERM
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **extra_env})
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        del os.environ[k]  # a local launch inside a Slurm job must not read Slurm's layout
    run_then_exit(target, args, f"rank {rank}: ")


def run_then_exit(target: Callable[..., Any], args: tuple[Any, ...], label: str = "") -> None:
    """A local rank's whole life: ``target(*args)``, then :func:`exit_rank` with its code
    (a HetschedError: one line and its exit code; any other error: its traceback, 1)."""
    code = 0
    try:
        target(*args)
    except HetschedError as e:  # one line per failed rank, not a traceback
        print(f"hetsched: error: {label}{e}", file=sys.stderr, flush=True)
        code = e.exit_code
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - the rank's traceback, then its exit code
        traceback.print_exc()
        code = 1
    exit_rank(code)


def exit_rank(code: int) -> None:
    """End a rank's process (a local one, or ``hetsched run``/``exec`` in a Slurm step)
    without the interpreter's teardown.

    The rank has destroyed its process group and written its checkpoint and
    report; the Python exit hooks (shared-memory unlinks) run here and the
    output is flushed. What is skipped is the interpreter's finalization with
    the C++ destructors of torch's objects: on a loaded CI machine it aborted a
    rank that had finished ("terminate called without an active exception",
    SIGABRT), and the launcher then stopped its peer and reported a failed
    run. It was seen once and not reproduced here in about 25 runs under load, so the
    cause inside torch is not pinned down; the message is the one a C++ thread
    object gives when destroyed still joinable, as at finalization, the step
    this removes.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)


def spawn_local(world_size: int, target: Callable[..., Any], args: tuple[Any, ...] = (),
                extra_env: Mapping[str, str] | None = None,
                per_rank_env: Sequence[Mapping[str, str]] | None = None,
                timeout_s: float = 300.0) -> list[int]:
    """Local mode: run ``target(*args)`` in ``world_size`` fresh processes (spawn) that
    rendezvous on 127.0.0.1; returns their exit codes. A failed rank stops the rest, so
    a test never hangs on a collective that will not complete."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs: list[Any] = []
    received: list[int] = []
    told: set[int] = set()

    def forward(signum: int, _frame: object) -> None:
        # the ranks stop gracefully on SIGTERM (finish the step, checkpoint, exit)
        received.append(signum)
        _tell(procs, told)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread: the caller handles signals
            pass
    try:
        for r in range(world_size):
            env = dict(extra_env or {})
            if per_rank_env:
                env.update(per_rank_env[r])
            p = ctx.Process(target=_child, args=(r, world_size, port, env, target, args,
                                                 os.getpid()))
            p.start()
            procs.append(p)
        _wait(procs, received, told, timeout_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.exitcode if p.exitcode is not None else -9 for p in procs]
    if received:
        raise Stopped(received[0], codes)
    return codes


def _tell(procs: list[Any], told: set[int]) -> None:
    """SIGTERM each rank once: a second one would kill a rank that already stopped
    gracefully and restored the default handler, in the middle of its peers' barrier."""
    for p in procs:
        if p.pid and p.pid not in told and p.is_alive():
            told.add(p.pid)
            os.kill(p.pid, signal.SIGTERM)


def _wait(procs: list[Any], received: list[int], told: set[int], timeout_s: float) -> None:
    """Until every rank exits; a failed rank, the timeout or a signal's grace stops the rest."""
    deadline = time.monotonic() + timeout_s
    while any(p.is_alive() for p in procs):
        if received:
            _tell(procs, told)  # a rank started while the signal arrived has not seen it
            deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
            received_at = len(received)
            while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
                for p in procs:
                    p.join(0.05)
                if len(received) > received_at:  # asked again: do not wait any longer
                    break
            for p in procs:
                if p.is_alive():
                    p.kill()
            break
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
            for p in procs:
                if p.is_alive():
                    p.terminate()
            break
        for p in procs:
            p.join(0.05)
    for p in procs:
        p.join(5)
