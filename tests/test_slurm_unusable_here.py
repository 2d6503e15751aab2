"""A machine where hetsched cannot use Slurm as it does says what to do, in one line.

Stand-in `sinfo`s print what Slurm prints there (a login node without slurm.conf
and no configless DNS record; a Slurm older than 21.08, which has no ``--json``)
and exit 1, as the real ones do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.slurm.runner import hint

NO_CONFIG = ("sinfo: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
             "sinfo: error: fetch_config: DNS SRV lookup failed\n"
             "sinfo: error: _establish_config_source: failed to fetch config\n"
             "sinfo: fatal: Could not establish a configuration source\n")
NO_JSON = "sinfo: unrecognized option '--json'\nTry \"sinfo --help\" for more information\n"


@pytest.mark.parametrize(("said", "expected"), [
    (NO_CONFIG, "no Slurm configuration on this machine: set SLURM_CONF"),
    (NO_JSON, "it needs Slurm 21.08 or later, built with JSON support"),
])
def test_cluster_says_what_to_do(tmp_path: Path, said: str, expected: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "said.txt").write_text(said)
    (bin_dir / "sinfo").write_text(f"#!/bin/sh\ncat {tmp_path / 'said.txt'} >&2\nexit 1\n")
    (bin_dir / "sinfo").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "HETSCHED_STATE": str(tmp_path / "s.db")}
    r = subprocess.run([sys.executable, "-m", "hetsched", "cluster"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetsched: error: `sinfo --json` exited 1")
    assert expected in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_other_failures_get_no_hint() -> None:
    assert hint(["sinfo", "--json"], "sinfo: error: Invalid partition name specified") == ""
    assert hint(["sbatch", "x.sh"], "sbatch: error: invalid partition") == ""
