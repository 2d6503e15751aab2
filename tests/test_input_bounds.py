"""Numbers that are not numbers, oversized inputs, silent surprises.

Each case runs the real CLI in a subprocess (as a user meets it) and asserts
one line on stderr naming the file, the field and the bound, exit 2, quickly:
"quickly" is the child's own CPU time, which a busy machine does not inflate
the way it inflates wall-clock time.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hetsched.core import limits
from hetsched.core.spec import Job
from hetsched.errors import InputError

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
CLI = "from hetsched.cli.main import main; main()"


def hetsched(*args: str | Path, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str],
                                                               float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def plan(jobs: Path, cluster: Path = EX / "cluster.yaml",
         profiles: Path = EX / "gavel_throughputs.csv"
         ) -> tuple[subprocess.CompletedProcess[str], float]:
    return hetsched("plan", jobs, "--cluster", cluster, "--throughputs", profiles,
                    "--format", "json")


def one_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def edit(src: Path, dst: Path, old: str, new: str) -> Path:
    text = src.read_text()
    assert old in text
    dst.write_text(text.replace(old, new, 1))
    return dst


@pytest.mark.parametrize("old,new,field,bound", [
    ("dataset_size: 50000", "dataset_size: 1.0e+308", "dataset_size", "1e+12"),
    ("weight: 2", "weight: 1.0e+308", "weight", "1e+06"),
    ("weight: 2", "weight: 1e308", "weight", "1e+06"),  # YAML 1.1 reads this as text
    ("global_batch: 80", "global_batch: 1.0e+308", "global_batch", "1e+07"),
    ("epochs: 3", "epochs: " + "9" * 400, "epochs", "400-digit"),
    ("epochs: 3", "epochs: .inf", "epochs", "finite"),
    ("epochs: 3", "epochs: .nan", "epochs", "finite"),
    ("arrival_s: 600", "arrival_s: 1.0e+300", "arrival_s", "1e+09"),
])
def test_job_numbers_bounded(tmp_path: Path, old: str, new: str, field: str, bound: str
                             ) -> None:
    jobs = edit(EX / "jobs.yaml", tmp_path / "jobs.yaml", old, new)
    r, took = plan(jobs)
    one_line(r, str(jobs), field, bound)
    assert took < 20


def test_gpus_ten_million_refused_quickly(tmp_path: Path) -> None:
    cluster = edit(EX / "cluster.yaml", tmp_path / "c.yaml", "gpus: 4", "gpus: 10000000")
    r, took = plan(EX / "jobs.yaml", cluster)
    one_line(r, str(cluster), "nodes[0]: gpus", "1024")
    assert took < 20


def test_huge_hostlist_refused_without_expanding(tmp_path: Path) -> None:
    cluster = edit(EX / "cluster.yaml", tmp_path / "c.yaml", "v100-[1-2]",
                   "v100-[1-999999999999]")
    r, took = plan(EX / "jobs.yaml", cluster)
    one_line(r, str(cluster), "nodes[0]", str(limits.MAX_NODES))
    assert took < 20


def test_yaml_nested_5000_deep(tmp_path: Path) -> None:
    jobs = tmp_path / "deep.yaml"
    jobs.write_text("jobs: " + "[" * 5000 + "]" * 5000 + "\n")
    r, _ = plan(jobs)
    one_line(r, str(jobs), "nested", str(limits.MAX_YAML_DEPTH))
    block = tmp_path / "block.yaml"
    block.write_text("".join(" " * i + "- \n" for i in range(0, 2 * 1000, 2)))
    r, _ = plan(block)
    one_line(r, str(block), str(limits.MAX_YAML_DEPTH))


def test_50_mb_yaml_refused_quickly(tmp_path: Path) -> None:
    jobs = tmp_path / "big.yaml"
    jobs.write_text((EX / "jobs.yaml").read_text() + "#" + "x" * 50_000_000 + "\n")
    r, took = plan(jobs)
    one_line(r, str(jobs), "MiB", "limit")
    assert took < 20


def test_csv_field_over_128_kib(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    header = (EX / "gavel_throughputs.csv").read_text().splitlines()[0]
    csv.write_text(header + "\n" + "a" * (130 * 1024) + ",v100,1,1\n")
    r, _ = plan(EX / "jobs.yaml", profiles=csv)
    one_line(r, str(csv), "line", "128 KiB")


def test_csv_number_bounds(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    text = (EX / "gavel_throughputs.csv").read_text().splitlines()
    csv.write_text("\n".join([text[0], "resnet-18,v100,32,1e300"] + text[1:]) + "\n")
    r, _ = plan(EX / "jobs.yaml", profiles=csv)
    one_line(r, str(csv), "line 2", "step_time_s", "1e+06")


def test_node_state_typo_names_valid_states(tmp_path: Path) -> None:
    cluster = edit(EX / "cluster.yaml", tmp_path / "c.yaml", "gpu_type: p100",
                   "gpu_type: p100\n    state: idel")
    r, _ = plan(EX / "jobs.yaml", cluster)
    one_line(r, str(cluster), "nodes[1]: state", "'idel'", "idle", "drained")


def test_gpu_type_without_profiles_warns_on_stderr(tmp_path: Path) -> None:
    cluster = edit(EX / "cluster.yaml", tmp_path / "c.yaml", "gpu_type: p100",
                   "gpu_type: t4")
    r, _ = plan(EX / "jobs.yaml", cluster)
    assert r.returncode == 0, r.stderr
    assert "warning" in r.stderr and "'t4'" in r.stderr and "idle" in r.stderr
    assert '"plan_id"' in r.stdout


def test_csv_with_utf8_bom_accepted(tmp_path: Path) -> None:
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbf" + (EX / "gavel_throughputs.csv").read_bytes())
    r, _ = plan(EX / "jobs.yaml", profiles=csv)
    assert r.returncode == 0, r.stderr
    jobs = tmp_path / "bom.yaml"
    jobs.write_bytes(b"\xef\xbb\xbf" + (EX / "jobs.yaml").read_bytes())
    r, _ = plan(jobs)
    assert r.returncode == 0, r.stderr


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    jobs = edit(EX / "jobs.yaml", tmp_path / "dup.yaml", "    epochs: 20\n",
                "    epochs: 20\n    epochs: 2\n")
    r, _ = plan(jobs)
    one_line(r, str(jobs), "'epochs'", "twice", "line")


def test_job_built_in_code_is_validated() -> None:
    with pytest.raises(InputError) as e:
        Job("a", "w", 100, 1, 0)
    assert str(e.value) == "Job: job 'a': global_batch: must be >= 1, got 0"
    with pytest.raises(InputError, match="epochs: expected a finite number"):
        Job("a", "w", 100, float("nan"), 32)
    with pytest.raises(InputError, match="dataset_size: must be <= 1e"):
        Job("a", "w", 10**15, 1, 32)
    with pytest.raises(InputError, match="name: 'a b' is not valid"):
        Job("a b", "w", 100, 1, 32)
    with pytest.raises(InputError, match="max_gpus: must be >= min_gpus"):
        Job("a", "w", 100, 1, 32, min_gpus=4, max_gpus=2)
    assert Job("a", "w", 100, 1, 32).steps_per_epoch == 4
