"""`hetsched run`'s rendezvous: torch's TCPStore listens on the rendezvous address only
(loopback for a local run), and nothing crosses between ranks pickled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetsched.runtime import elastic
from hetsched.runtime.launcher import spawn_local


def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp shows them) listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                out.append(addr)
    return out


def _rank(out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from hetsched.runtime.launcher import from_env
    from hetsched.runtime.rendezvous import init_distributed

    renv = from_env()
    init_distributed(renv, "cpu")
    req = elastic.broadcast_request(os.path.join(out_dir, "req.json") if renv.rank == 0
                                    else None, renv.world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    if renv.rank == 0:
        Path(out_dir, "listen.txt").write_text(" ".join(_listeners(renv.master_port)))
    Path(out_dir, f"req-{renv.rank}.txt").write_text(f"{req.seq} {req.local_batches} {t.item()}")
    dist.barrier()


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")
def test_local_store_listens_on_loopback_and_requests_cross_as_tensors(tmp_path: Path) -> None:
    elastic.write_request(tmp_path / "req.json", [3, 5, 7], seq=4)
    codes = spawn_local(3, _rank, (str(tmp_path),), timeout_s=240)
    assert codes == [0, 0, 0]
    listen = (tmp_path / "listen.txt").read_text().split()
    assert listen and set(listen) == {"0100007F"}, listen  # 127.0.0.1 only, no 0.0.0.0 / ::
    for r in range(3):
        assert (tmp_path / f"req-{r}.txt").read_text() == "4 [3, 5, 7] 3.0"


def test_request_encoding_round_trips_and_refuses_garbage() -> None:
    req = elastic.Request(9, [1, 2, 3])
    assert elastic.decode_request(elastic.encode_request(req)) == req
    assert elastic.decode_request(elastic.encode_request(None)) is None
    with pytest.raises(RuntimeError, match="malformed"):
        elastic.decode_request([1, 5, 2])
    with pytest.raises(RuntimeError, match="malformed"):
        elastic.decode_request([1, 10**9])
