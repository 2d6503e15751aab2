"""Pool plans for the executor tests, made by the real planner CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MAIN = "import sys; from hetsched.cli.main import main; sys.argv[0] = \"hetsched\"; main()"

#: three jobs with unequal slices (B=10 over 3 tasks: 4,3,3; B=7 over 2: 4,3)
JOBS = """jobs:
  - {name: a, workload: mlp, dataset_size: 60, epochs: 1, global_batch: 10, requested_gpus: 3,
     memory_gb: 1}
  - {name: b, workload: mlp, dataset_size: 48, epochs: 1, global_batch: 8, requested_gpus: 2,
     memory_gb: 1}
  - {name: c, workload: tiny-transformer, dataset_size: 40, epochs: 1, global_batch: 7,
     requested_gpus: 2, memory_gb: 1}
"""


def cluster_yaml(gpus: int, mem_gb: float = 2.0) -> str:
    types = ["v100", "k80", "p100"]
    nodes = "\n".join(f"  - {{names: n{k + 1}, gpu_type: {types[k % 3]}, gpus: 1, "
                      f"gpu_memory_gb: {mem_gb}}}" for k in range(gpus))
    return f"name: t\nnodes:\n{nodes}\n"


def throughputs() -> str:
    rows = ["workload,gpu_type,local_batch,step_time_s"]
    for w, s in (("mlp", 1.0), ("tiny-transformer", 1.5), ("cnn", 1.2)):
        for t, f in (("v100", 1.0), ("k80", 2.0), ("p100", 1.5)):
            for b in (1, 4, 8, 16):
                rows.append(f"{w},{t},{b},{(0.01 + 0.002 * b) * s * f:.5f}")
    return "\n".join(rows) + "\n"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT)
    for k in [k for k in e if k.startswith(("SLURM_", "HETSCHED_EMULATE"))]:
        del e[k]
    return e


def make_plan(tmp: Path, gpus: int = 2, task_iterations: int = 2, mem_gb: float = 2.0,
              jobs: str = JOBS, space: str = "off") -> Path:
    """A pool plan of ``jobs``; ``space="off"``: Hare on the pool model alone (equal slices,
    jobs interleaved: what these tests exercise), ``"seed"``: pool mode's default (Hare
    from the space plan's task plan, uneven tasks)."""
    (tmp / "jobs.yaml").write_text(jobs)
    (tmp / "cluster.yaml").write_text(cluster_yaml(gpus, mem_gb))
    (tmp / "tp.csv").write_text(throughputs())
    out = tmp / "pool.json"
    subprocess.run([sys.executable, "-c", MAIN, "plan", str(tmp / "jobs.yaml"),
                    "--cluster", str(tmp / "cluster.yaml"), "--throughputs", str(tmp / "tp.csv"),
                    "--mode", "pool", "--task-iterations", str(task_iterations),
                    "--policy", "hare", "--param", f"space={space}",
                    "--out", str(out)], check=True, env=env(), capture_output=True)
    return out


def hetsched(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN, *args], env=env(), text=True,
                          capture_output=True, timeout=timeout)


def plan_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def small_exec_plan(tmp: Path) -> Any:
    """The executor's view (ExecPlan) of a 2-GPU pool plan of one-iteration tasks."""
    from hetsched.io.plan_json import load_plan
    from hetsched.runtime.executor.plan import exec_plan

    return exec_plan(load_plan(make_plan(tmp, gpus=2, task_iterations=1)))


def loopback_coordinator(xplan: Any) -> Any:
    """A coordinator on 127.0.0.1 with a fresh secret, for tests that talk to it directly
    (``.port`` is where it listens; the caller closes it)."""
    from hetsched.io.secret import new_secret
    from hetsched.runtime.executor import protocol
    from hetsched.runtime.executor.coordinator import Coordinator

    lis = protocol.listen("127.0.0.1", 0)
    c = Coordinator(xplan, xplan.gpu_ids(), lis, new_secret(), None, hello_timeout_s=600.0,
                    handshake_timeout_s=2.0)
    c.port = lis.getsockname()[1]
    return c
