"""SlurmClient against the real testbed, plus the parsers on both JSON layouts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from slurm_helpers import wait_for

from hetsched.cli import testbed as cli_testbed
from hetsched.slurm.client import (
    CliSlurmClient,
    node_state,
    parse_gres,
    parse_job_json,
    pyslurm_status,
)
from hetsched.slurm.inventory import InventoryError, load_inventory
from hetsched.slurm.runner import CommandError, Runner, SlurmUnavailable
from hetsched.slurm.testbed import Testbed

pytestmark = pytest.mark.slurm


def test_parse_job_both_layouts() -> None:
    old = {"job_id": 7, "het_job_id": 7, "het_job_offset": 1, "job_state": "PENDING",
           "name": "a", "comment": "hetsched:p1", "exit_code": 0, "nodes": ""}
    new = {"job_id": 7, "het_job_id": {"set": True, "infinite": False, "number": 7},
           "het_job_offset": {"set": True, "number": 1}, "job_state": ["PENDING"],
           "name": "a", "comment": "hetsched:p1",
           "exit_code": {"status": ["SUCCESS"], "return_code": {"set": True, "number": 0}}}
    a, b = parse_job_json(old), parse_job_json(new)
    assert a == b
    assert a.leader == "7" and a.het_offset == 1 and a.exit_code == 0
    # 22.05 gives the raw wait status (`scontrol` says ExitCode=2:0 for 512)
    for raw, code in ((512, 2), (256, 1), (9, 137), (0, 0)):
        assert parse_job_json({**old, "exit_code": raw}).exit_code == code
    two = {**new, "exit_code": {"status": ["ERROR"], "return_code": {"set": True, "number": 2}}}
    assert parse_job_json(two).exit_code == 2
    plain = parse_job_json({"job_id": 9, "het_job_id": 0, "job_state": "RUNNING"})
    assert plain.leader == "9" and plain.het_offset is None


def test_node_state_and_gres() -> None:
    assert node_state("idle", ["DRAIN"]) == "drained"
    assert node_state("mixed", ["DRAIN"]) == "draining"
    assert node_state(["IDLE", "NOT_RESPONDING"], None) == "down"
    assert node_state("down", []) == "down"
    assert node_state(["MIXED"], []) == "mixed"
    assert parse_gres("gpu:a100:2(S:0-1),gpu:t4:1") == {"a100": 2, "t4": 1}
    assert parse_gres("gpu:a100:1(IDX:0)") == {"a100": 1}


def test_runner_retries_transient_then_gives_up() -> None:
    sleeps: list[float] = []
    r = Runner(retries=2, backoff_s=0.1, sleep=sleeps.append)
    with pytest.raises(SlurmUnavailable) as ei:
        r.run(["sh", "-c", "echo 'error: Socket timed out on send/recv' >&2; exit 1"])
    assert sleeps == [0.1, 0.2]  # bounded, exponential
    assert "Socket timed out" in str(ei.value)
    with pytest.raises(CommandError, match="not installed"):
        r.run(["no-such-program-hetsched"])
    with pytest.raises(CommandError, match="exited 3: boom"):
        r.run(["sh", "-c", "echo boom >&2; exit 3"])
    assert len(sleeps) == 2  # a permanent error is not retried


def test_sbatch_error_quotes_slurm(client: CliSlurmClient, tmp_path) -> None:
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\n#SBATCH --partition=nope\ntrue\n")
    with pytest.raises(CommandError, match="invalid partition"):
        client.submit(script)


def test_inventory_and_drain(testbed: Testbed, client: CliSlurmClient, clean_queue: None) -> None:
    inv = load_inventory(client, "gpu")
    assert inv.cluster.count_by_type() == {"a100": 4, "t4": 4, "v100": 8}
    assert sum(inv.free.values()) == 16
    client.runner.run(["scontrol", "update", "nodename=v100-2", "state=drain",
                       "reason=hetsched-test"])
    inv = load_inventory(client, "gpu")
    states = {n.name: n.state for n in inv.cluster.nodes}
    assert states["v100-2"] == "drained"
    assert inv.cluster.count_by_type()["v100"] == 4  # drained GPUs are not planned on
    assert not any(g.node == "v100-2" for g in inv.cluster.gpus)
    res = CliRunner().invoke(cli_testbed.cluster, ["--partition", "gpu"])
    assert res.exit_code == 0, res.output
    assert "drained" in res.output and "v100" in res.output
    with pytest.raises(InventoryError, match="nope"):
        load_inventory(client, "nope")


def test_free_gpus_follow_allocation(testbed: Testbed, client: CliSlurmClient,
                                     clean_queue: None, tmp_path) -> None:
    script = tmp_path / "s.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:t4:3 --output=/dev/null\nsleep 30\n")
    jid = client.submit(script)
    wait_for(lambda: any(j.job_id == jid and j.state == "RUNNING" for j in client.jobs()),
             15, "job to run")
    inv = load_inventory(client, "gpu")
    assert inv.free["t4-1"] == 1
    assert {n.name: n.state for n in inv.cluster.nodes}["t4-1"] == "mixed"
    client.cancel([jid])


def test_detail_without_accounting(client: CliSlurmClient, tmp_path) -> None:
    assert client.accounting_enabled() is False
    assert client.job_detail("999999") == []
    ok, why = pyslurm_status(client.version())
    assert not ok and "CLI" in why
