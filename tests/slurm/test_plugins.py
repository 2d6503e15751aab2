"""slurm_plugins/: job_submit.lua and the SPANK plugin, loaded by a real testbed."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import contract_plan, wait_for

from hetsched.app.submit import SubmitError, submit
from hetsched.errors import InputError
from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import CommandError, Runner
from hetsched.slurm.testbed import Testbed
from hetsched.state.store import open_store

pytestmark = pytest.mark.slurm

PLUGINS = Path(__file__).resolve().parents[2] / "slurm_plugins"
SPANK_H = Path("/usr/include/slurm/spank.h")


def build_spank(out_dir: Path) -> Path | None:
    """Compile spank_hetsched.c; None when gcc or Slurm's headers are missing."""
    if shutil.which("gcc") is None or not SPANK_H.exists():
        return None
    so = out_dir / "spank_hetsched.so"
    subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(so),
                    str(PLUGINS / "spank_hetsched.c")], check=True)
    return so


@pytest.fixture(scope="module")
def plugin_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    if shutil.which("slurmctld") is None:
        pytest.skip("needs slurmctld/slurmd/munge (apt-get install slurmctld slurmd munge)")
    d = tmp_path_factory.mktemp("lua")
    so = build_spank(d)
    tb = Testbed(d / "tb", nodes="a100:1x1,t4:1x2", lua=True, spank_plugin=so)
    try:
        tb.up(timeout_s=60)
        yield tb
    finally:
        tb.down()


@pytest.fixture()
def lua_client(plugin_bed: Testbed) -> CliSlurmClient:
    return CliSlurmClient(Runner(env=plugin_bed.env(), timeout_s=20, retries=2))


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text("#!/bin/bash\n" + body)
    return p


def test_lua_rejects_gpu_type_the_partition_lacks(lua_client: CliSlurmClient,
                                                  tmp_path: Path) -> None:
    bad = _script(tmp_path, "bad.sh", "#SBATCH --gres=gpu:h100:1\ntrue\n")
    with pytest.raises(CommandError, match="partition gpu has no GPU type 'h100'"):
        lua_client.submit(bad)
    ok = _script(tmp_path, "ok.sh", "#SBATCH --gres=gpu:t4:1 --output=/dev/null\ntrue\n")
    assert lua_client.submit(ok).isdigit()


def test_lua_tags_hetsched_jobs_and_plan_failure_rolls_back(
        plugin_bed: Testbed, lua_client: CliSlurmClient, tmp_path: Path) -> None:
    plan = contract_plan("lua1", {"l1": [[("a100-1", "a100", 8), ("t4-1", "t4", 4)]]})
    with open_store(tmp_path / "s.db") as st:
        jid = dict(submit(plan, st, lua_client, partition="gpu").submitted)["l1"]
    comps = [c for c in lua_client.job_detail(jid)]
    assert len(comps) == 2
    res = lua_client.runner.run(["scontrol", "show", "job", "--oneliner", jid])
    assert res.stdout.count("AdminComment=hetsched plan=lua1 job=l1 segment=0") == 2
    lua_client.cancel([jid])
    bad = contract_plan("lua2", {"m1": [[("t4-1", "t4", 4)]], "m2": [[("a100-1", "a100", 4)]],
                             "m3": [[("a100-1", "h100", 4)]]})
    # pinned (the default), hetsched itself refuses the wrong type before any sbatch
    with open_store(tmp_path / "s2.db") as st:
        with pytest.raises(InputError, match="has h100 GPUs on node a100-1"):
            submit(bad, st, lua_client, partition="gpu")
    assert not [j for j in lua_client.jobs() if j.comment.startswith("hetsched:lua2:")]
    # unpinned, GRES carries the type: the plugin refuses m3 after m1 and m2 went in,
    # and submit rolls them back
    with open_store(tmp_path / "s3.db") as st:
        with pytest.raises(SubmitError, match="no GPU type 'h100'"):
            submit(bad, st, lua_client, partition="gpu", pin_nodes=False)
    live = [j for j in lua_client.jobs()
            if j.comment.startswith("hetsched:lua2:") and not j.finished]
    assert live == []


def test_spank_option_sets_plan_id(plugin_bed: Testbed, lua_client: CliSlurmClient,
                                   tmp_path: Path) -> None:
    if plugin_bed.spank_plugin is None:
        pytest.skip(f"SPANK plugin not built: needs gcc and {SPANK_H} "
                    "(apt-get install libslurm-dev)")
    out = tmp_path / "o.txt"
    s = _script(tmp_path, "sp.sh", f"#SBATCH --output={out}\necho plan=$HETSCHED_PLAN_ID\n")
    jid = lua_client.submit(s, extra_args=["--hetsched-plan=p42"])
    wait_for(lambda: out.exists() and "plan=" in out.read_text(), 20, "job output")
    assert out.read_text().strip() == "plan=p42", jid
    with pytest.raises(CommandError, match="hetsched-plan"):
        lua_client.submit(s, extra_args=["--hetsched-plan=a;b"])
