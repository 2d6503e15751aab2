"""A real Slurm testbed for the whole test session (never a mocked sbatch).

The testbed comes up once per session in a temporary directory and goes down
at the end, whatever happened. Tests that need a clean queue use
``clean_queue``; each test uses its own job names so leftovers never match.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from slurm_helpers import wait_for

from hetsched.slurm.client import CliSlurmClient
from hetsched.slurm.runner import Runner
from hetsched.slurm.testbed import Testbed

NEEDED = ("slurmctld", "slurmd", "munged", "sbatch", "squeue")


def _missing() -> list[str]:
    return [p for p in NEEDED if shutil.which(p) is None]


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    missing = _missing()
    if missing:
        pytest.skip(f"Slurm testbed needs {', '.join(missing)} "
                    "(apt-get install slurmctld slurmd slurm-client munge)")
    tb = Testbed(tmp_path_factory.mktemp("tb"), nodes="a100:2x2,v100:2x4,t4:1x4")
    old = {k: os.environ.get(k) for k in tb.env()}
    try:
        tb.up(timeout_s=60)
        os.environ.update(tb.env())  # CLI commands run in-process read these
        # job steps run this stand-in for `hetsched run` (tests of the real one set
        # HETSCHED_EXECUTABLE: slurm_helpers.use_real_hetsched)
        stub = tb.dir / "fake-hetsched"
        stub.write_text("#!/bin/bash\necho \"fake hetsched $* rank=$SLURM_PROCID\"\n"
                        "exec sleep \"${HETSCHED_TEST_SLEEP:-120}\"\n")
        stub.chmod(0o755)
        old.setdefault("HETSCHED_EXECUTABLE", os.environ.get("HETSCHED_EXECUTABLE"))
        os.environ["HETSCHED_EXECUTABLE"] = str(stub)
        yield tb
    finally:
        tb.down()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture()
def client(testbed: Testbed) -> CliSlurmClient:
    return CliSlurmClient(Runner(env=testbed.env(), timeout_s=20, retries=3, backoff_s=0.3))


@pytest.fixture()
def clean_queue(testbed: Testbed, client: CliSlurmClient) -> Iterator[None]:
    """Cancel every active job before the test and make all nodes idle again."""
    _reset(testbed, client)
    yield
    _reset(testbed, client)


def _reset(testbed: Testbed, client: CliSlurmClient) -> None:
    client.runner.run(["scancel", "--partition", "gpu"], check=False)
    for n in testbed.node_confs:
        testbed.start_node(n.name)
    client.runner.run(["scontrol", "update", "nodename=ALL", "state=resume"], check=False)
    wait_for(lambda: not [j for j in client.jobs() if not j.finished], 20, "queue to drain")
    testbed.wait_idle(30)
