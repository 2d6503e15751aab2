"""Fuzz the real CLI with mutated job, cluster, profile and plan files.

Each example writes the example files with one mutation (a hostile value in
a field, a deleted or unknown field, a duplicated entry, a truncated or
scribbled text, a byte-order mark) and runs ``hetsched plan`` (or, for plan
files, ``hetsched submit --dry-run``, which goes through ``load_plan``) in a
subprocess with limits on memory, CPU time and wall time. Every outcome must
be one of:

* exit 0 with a plan whose JSON holds only finite numbers and passes the plan
  contract (``plan_from_dict``);
* exit 2 with exactly one line on stderr, ``hetsched: error: FILE: ...``,
  naming one of the input files;

never a traceback, another exit code, a hang, or memory beyond the limit.

Seeded (``derandomize``) and bounded: ``HETSCHED_FUZZ_EXAMPLES`` examples per
file kind (default 8; ``HETSCHED_FUZZ_EXAMPLES=200`` for a long run).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hetsched.io.plan_json import plan_from_dict

pytestmark = pytest.mark.slow  # subprocesses or multi-process torch: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"
CLI = "from hetsched.cli.main import main; main()"
EXAMPLES = int(os.environ.get("HETSCHED_FUZZ_EXAMPLES", "8"))
MEMORY_LIMIT = 3 * 1024**3  # address space of the CLI process
CPU_LIMIT_S = 90
WALL_LIMIT_S = 240  # generous: the CI VM is shared; a hang is far beyond it

# no shrinking: each example is a CLI process; the failing one is reported as drawn
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

HOSTILE: list[Any] = [
    0, -1, 1.5, 0.0001, 1e308, float("inf"), float("-inf"), float("nan"), 10**400,
    2**63, "9" * 400, "", "x" * 5000, None, True, [], {}, [[[]]], {"a": {"b": 1}},
    "idel", "a\nb", "$(touch /tmp/hetsched-fuzz-pwned)", "`id`", "'\"", "#SBATCH --x",
    "\u00ff\u2603", "1e308", "-0", "v100", 10_000_000,
]
HOSTILE_TEXT = ["0", "-1", "nan", "inf", "1e308", "9" * 400, "", "x" * (130 * 1024),
                "1,2", '"', "a\nb", "\u2603", "1e-320", "0x10", " 32 "]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


def run_cli(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HETSCHED_STATE": str(cwd / "state.db"),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=WALL_LIMIT_S,
                              preexec_fn=_limits)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hetsched {' '.join(map(str, args))} hung (> {WALL_LIMIT_S} s)")


def _no_constant(name: str) -> float:
    raise AssertionError(f"non-finite number {name} in the plan JSON")


def check_outcome(r: subprocess.CompletedProcess[str], inputs: list[Path], *,
                  plan_on_stdout: bool) -> None:
    err = r.stderr
    assert "Traceback" not in err, err[-3000:]
    if r.returncode == 0:
        if plan_on_stdout:
            data = json.loads(r.stdout, parse_constant=_no_constant)
            plan_from_dict(data, "stdout")
        return
    assert r.returncode == 2, (r.returncode, err[-3000:])
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("hetsched: warning:")]
    assert len(lines) == 1, err[-3000:]
    line = lines[0]
    assert line.startswith("hetsched: error: "), line
    assert any(f"{p}:" in line for p in inputs), (line[:500], inputs)
    assert len(line) < 2000, line[:300]


# -- mutations ------------------------------------------------------------------


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def mutate_tree(data: st.DataObject, doc: Any) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths), label="path")
        op = data.draw(st.sampled_from(["replace", "delete", "unknown", "duplicate"]),
                       label="op")
        if not path:
            if op == "replace":
                doc = data.draw(st.sampled_from(HOSTILE), label="value")
            continue
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "replace":
            parent[key] = data.draw(st.sampled_from(HOSTILE), label="value")
        elif op == "delete":
            del parent[key]
        elif op == "unknown" and isinstance(parent[key], dict):
            parent[key]["surprise"] = data.draw(st.sampled_from(HOSTILE), label="value")
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
    return doc


def mutate_text(data: st.DataObject, text: str) -> str:
    op = data.draw(st.sampled_from(["truncate", "insert", "dup-line", "bom", "delete-line"]),
                   label="text-op")
    lines = text.splitlines(keepends=True)
    if op == "truncate":
        return text[: data.draw(st.integers(0, len(text)), label="at")]
    if op == "insert":
        at = data.draw(st.integers(0, len(text)), label="at")
        junk = data.draw(st.text(max_size=8) | st.sampled_from(["[", "{", ":", "- ", "\t",
                                                                "&a", "*a", "!!python/"]),
                         label="junk")
        return text[:at] + junk + text[at:]
    if op == "bom":
        return "\ufeff" + text
    i = data.draw(st.integers(0, max(0, len(lines) - 1)), label="line")
    if op == "dup-line":
        return "".join(lines[: i + 1] + lines[i:])
    return "".join(lines[:i] + lines[i + 1:])


def mutated_yaml(data: st.DataObject, src: Path) -> str:
    if data.draw(st.booleans(), label="structural"):
        doc = mutate_tree(data, yaml.safe_load(src.read_text()))
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    return mutate_text(data, src.read_text())


def mutated_csv(data: st.DataObject, src: Path) -> str:
    text = src.read_text()
    if not data.draw(st.booleans(), label="structural"):
        return mutate_text(data, text)
    rows = list(csv.reader(io.StringIO(text)))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        r = data.draw(st.integers(0, len(rows) - 1), label="row")
        if not rows[r]:
            continue
        c = data.draw(st.integers(0, len(rows[r]) - 1), label="col")
        op = data.draw(st.sampled_from(["cell", "drop", "add"]), label="op")
        if op == "cell":
            rows[r][c] = data.draw(st.sampled_from(HOSTILE_TEXT), label="value")
        elif op == "drop":
            del rows[r][c]
        else:
            rows[r].append(data.draw(st.sampled_from(HOSTILE_TEXT), label="value"))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


# -- the suite --------------------------------------------------------------------


def _plan(tmp: Path, jobs: Path, cluster: Path, profiles: Path) -> None:
    r = run_cli("plan", jobs, "--cluster", cluster, "--throughputs", profiles,
                "--format", "json", "--no-gantt", cwd=tmp)
    check_outcome(r, [jobs, cluster, profiles], plan_on_stdout=True)


@FUZZ
@given(data=st.data())
def test_fuzz_jobs_file(tmp_path: Path, data: st.DataObject) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(mutated_yaml(data, EX / "jobs.yaml"))
    _plan(tmp_path, jobs, EX / "cluster.yaml", EX / "gavel_throughputs.csv")


@FUZZ
@given(data=st.data())
def test_fuzz_cluster_file(tmp_path: Path, data: st.DataObject) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(mutated_yaml(data, EX / "cluster.yaml"))
    _plan(tmp_path, EX / "jobs.yaml", cluster, EX / "gavel_throughputs.csv")


@FUZZ
@given(data=st.data())
def test_fuzz_profiles_file(tmp_path: Path, data: st.DataObject) -> None:
    profiles = tmp_path / "profiles.csv"
    profiles.write_text(mutated_csv(data, EX / "gavel_throughputs.csv"))
    _plan(tmp_path, EX / "jobs.yaml", EX / "cluster.yaml", profiles)


@pytest.fixture(scope="module")
def example_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("plan")
    r = run_cli("plan", EX / "jobs.yaml", "--cluster", EX / "cluster.yaml", "--throughputs",
                EX / "gavel_throughputs.csv", "--format", "json", "--no-gantt", cwd=d)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def _json_safe(doc: Any) -> str:
    return json.dumps(doc, default=str)  # NaN/Infinity stay as the tokens a plan must refuse


@FUZZ
@given(data=st.data())
def test_fuzz_plan_file(tmp_path: Path, example_plan: dict[str, Any],
                        data: st.DataObject) -> None:
    plan = tmp_path / "plan.json"
    if data.draw(st.booleans(), label="structural"):
        plan.write_text(_json_safe(mutate_tree(data, example_plan)))
    else:
        plan.write_text(mutate_text(data, json.dumps(example_plan, indent=1)))
    r = run_cli("submit", "--dry-run", plan, cwd=tmp_path)
    check_outcome(r, [plan], plan_on_stdout=False)
    assert not (tmp_path / "state.db").exists()  # a dry run touches no state
