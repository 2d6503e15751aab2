"""Joining the job's process group: the device, gloo or NCCL, and the rendezvous store.

Rank 0 serves torch's TCPStore on a socket bound to the rendezvous address only
(runtime/launcher.py finds it; 127.0.0.1 for ``--local``), not on every
interface as torch's own store does; a local CPU run's gloo pairs use the
loopback interface too. Imports torch when called.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from hetsched.errors import HetschedError
from hetsched.runtime.launcher import RankEnv, _resolve


def init_distributed(renv: RankEnv, device: str | None = None, timeout_s: float = 300.0) -> Any:
    """Join the process group (NCCL on CUDA, gloo on CPU); returns the torch.device to use.

    ``device`` forces ``cpu`` or ``cuda``; by default CUDA when torch sees a GPU.
    One process (world 1) does not create a group at all.
    """
    import datetime

    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if use_cuda:
        dev = torch.device("cuda", renv.local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    if renv.world_size > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if not use_cuda and _is_loopback(renv.master_addr):
            _gloo_on_loopback()
        store = rendezvous_store(renv, timeout)
        dist.init_process_group("nccl" if use_cuda else "gloo", store=store,
                                rank=renv.rank, world_size=renv.world_size, timeout=timeout)
    return dev


def _is_loopback(addr: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(_resolve(addr) or addr).is_loopback
    except ValueError:
        return False


def _gloo_on_loopback() -> None:
    """A local run's gloo pairs listen on the loopback interface, not the host's address."""
    if sys.platform.startswith("linux") and not os.environ.get("GLOO_SOCKET_IFNAME"):
        try:
            names = {n for _, n in socket.if_nameindex()}
        except OSError:
            return
        if "lo" in names:
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"


def store_socket(addr: str, port: int) -> socket.socket:
    """Rank 0's listening socket for torch's TCPStore, bound to the rendezvous address
    only (torch's own store listens on every interface)."""
    host = _resolve(addr) or addr
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise HetschedError(f"rank 0 cannot listen on {host}:{port} for the rendezvous "
                            f"({e.strerror}); set HETSCHED_MASTER_ADDR to this node's address "
                            "and HETSCHED_MASTER_PORT to a free port") from None
    return sock


def rendezvous_store(renv: RankEnv, timeout: Any) -> Any:
    """torch's TCPStore for the process group, as ``init_method="tcp://"`` makes it
    (multi-tenant, rank 0 waits for the others), except that rank 0 serves it on a
    socket bound to the rendezvous address only (127.0.0.1 for ``--local``)."""
    import torch.distributed as dist

    if renv.rank == 0:
        fd = store_socket(renv.master_addr, renv.master_port).detach()  # the store owns it
        try:
            return dist.TCPStore(renv.master_addr, renv.master_port, renv.world_size, True,
                                 timeout, multi_tenant=True, master_listen_fd=fd)
        except BaseException:
            os.close(fd)
            raise
    return dist.TCPStore(renv.master_addr, renv.master_port, renv.world_size, False, timeout,
                         multi_tenant=True)


def shutdown_distributed() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
