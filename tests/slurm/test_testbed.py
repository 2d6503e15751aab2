"""The testbed itself: up is idempotent, env is eval-safe, down stops everything."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetsched.cli import testbed as cli_testbed
from hetsched.errors import InputError
from hetsched.slurm.testbed import Testbed, TestbedError, default_port_base, parse_nodes

pytestmark = pytest.mark.slurm


def test_parse_nodes_rejects_bad_groups() -> None:
    assert [g.count for g in parse_nodes("a100:2x2,t4:1x4")] == [2, 1]
    for bad in ("a100:2", "a100:0x2", "a100:1x1,a100:1x2", "a;b:1x1", ""):
        with pytest.raises(InputError):
            parse_nodes(bad)


def test_ports_differ_per_dir(tmp_path: Path) -> None:
    assert default_port_base(tmp_path / "a") != default_port_base(tmp_path / "b")


def test_up_is_idempotent_and_nodes_idle(testbed: Testbed) -> None:
    before = testbed.processes()
    testbed.up(timeout_s=30)
    assert testbed.processes() == before
    states = testbed.node_states()
    assert sorted(states) == ["a100-1", "a100-2", "t4-1", "v100-1", "v100-2"]
    assert set(states.values()) == {"idle"}


def test_env_is_safe_for_eval(testbed: Testbed) -> None:
    res = CliRunner().invoke(cli_testbed.testbed, ["env", "--dir", str(testbed.dir)])
    assert res.exit_code == 0, res.output
    assert "export SLURM_CONF=" in res.output
    # the shell reads the lines back verbatim (a fixed script; the data comes via env)
    out = subprocess.run(["bash", "-c", 'eval "$LINES"; echo "$SLURM_CONF|$HETSCHED_STATE"'],
                         env={**os.environ, "LINES": res.output}, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == f"{testbed.conf}|{testbed.state_db}"


def test_status_cli(testbed: Testbed) -> None:
    res = CliRunner().invoke(cli_testbed.testbed, ["status", "--dir", str(testbed.dir)])
    assert res.exit_code == 0, res.output
    assert "slurmctld" in res.output and "a100-1" in res.output


def test_second_testbed_coexists_and_down_stops_all(tmp_path: Path, testbed: Testbed) -> None:
    # Port blocks come from a hash of the directory (200 blocks): two random
    # temp dirs collide 1 time in 200, so take the next block explicitly when
    # they do (users pass --port-base the same way).
    tb = Testbed(tmp_path / "tb2", nodes="t4:1x1")
    if tb.port_base == testbed.port_base:
        tb = Testbed(tmp_path / "tb2", nodes="t4:1x1",
                     port_base=10000 + (testbed.port_base - 10000 + 100) % 20000)
    assert tb.port_base != testbed.port_base
    try:
        tb.up(timeout_s=30)
        pids = [p for p in tb.processes().values() if p]
        assert len(pids) == 3  # munged, slurmctld, one slurmd
    finally:
        tb.down()
    assert not any(tb.processes().values())
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"slurm" not in Path(
            f"/proc/{pid}/cmdline").read_bytes()
    # the session testbed is untouched
    assert all(testbed.processes().values())
    # waiting on a stopped testbed fails with the log tail quoted
    with pytest.raises(TestbedError) as ei:
        tb.wait_idle(timeout_s=1)
    assert "slurmctld.log" in str(ei.value)


def test_changing_nodes_of_running_testbed_is_refused(testbed: Testbed) -> None:
    with pytest.raises(TestbedError, match="testbed down"):
        Testbed(testbed.dir, nodes="t4:1x1", port_base=testbed.port_base).up(timeout_s=5)


def test_a_testbed_in_a_deep_directory_runs_jobs(tmp_path: Path, testbed: Testbed) -> None:
    """A job step's socket lives in the slurmd spool (SPOOL/NODE/NODE_JOBID.STEPID): in a
    deep DIR it passed the 108-byte Unix socket limit and every job failed to launch
    ("launch failed requeued held"). Such a DIR gets its spool and munge socket in /tmp,
    both removed at down."""
    deep = tmp_path / ("d" * 40) / ("e" * 40) / "tb"
    short = Path("/tmp/hs-short-tb")  # never started: only where its spool would be
    assert Testbed(short, nodes="t4:1x1").slurmd_spool == short / "state" / "slurmd"
    tb = Testbed(deep, nodes="t4:1x1")
    if tb.port_base == testbed.port_base:
        tb = Testbed(deep, nodes="t4:1x1",
                     port_base=10000 + (testbed.port_base - 10000 + 100) % 20000)
    spool, munge = tb.slurmd_spool, tb.munge_socket.parent
    assert not spool.is_relative_to(deep) and len(str(spool / "t4-1" / "t4-1")) + 20 <= 107
    assert not munge.is_relative_to(deep)
    try:
        tb.up(timeout_s=30)
        out = tmp_path / "job.out"
        tb.runner.run(["sbatch", "--partition", "gpu", "--gres=gpu:t4:1", "--output", str(out),
                       "--wrap", "srun echo stepped"])
        deadline = time.monotonic() + 60
        while "stepped" not in (out.read_text() if out.exists() else ""):
            assert time.monotonic() < deadline, tb.runner.run(["squeue"]).stdout
            time.sleep(0.5)
    finally:
        tb.down()
    assert not spool.exists() and not munge.exists()  # nothing left in /tmp
