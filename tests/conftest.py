"""Shared fixtures of the planner tests (the Slurm tests have their own in tests/slurm/).

Factories and the hypothesis strategy live in ``planner_helpers`` so that test
modules can import them for ``@given``; the fixtures here wrap them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings
from planner_helpers import make_cluster, make_job, make_table

from hetsched.core.problem import PlanningProblem

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
SHARED = REPO.parent / "shared"

# Modest example counts keep the property tests short in `make test-fast`, and the
# default profile draws the same examples every run: a red `make test` reproduces, and
# CI never fails on a draw it has not seen before. HYPOTHESIS_PROFILE=thorough explores
# (many more examples, a fresh random draw each run).
settings.register_profile("default", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def hangups_delivered() -> Iterator[None]:
    """SIGHUP as a terminal sends it to a command not started under ``nohup``: a CI
    runner may start pytest ignoring it, and hetsched keeps an ignored hangup ignored
    (tests that send themselves SIGHUP use this)."""
    old = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGHUP, old)


@pytest.fixture(scope="session")
def examples() -> dict[str, Path]:
    """The bundled example inputs."""
    return {"jobs": EXAMPLES / "jobs.yaml", "cluster": EXAMPLES / "cluster.yaml",
            "throughputs": EXAMPLES / "gavel_throughputs.csv"}


@pytest.fixture(scope="session")
def gavel_data() -> Path:
    """Gavel's public data in ../shared/data/gavel (skipped where the checkout lacks it)."""
    d = SHARED / "data" / "gavel"
    if not (d / "simulation_throughputs.json").is_file():
        pytest.skip(f"Gavel data not found at {d} (expected ../shared next to the repository)")
    return d


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    """write(name, text) -> path of a file under the test's tmp dir."""

    def _write(name: str, text: str | bytes) -> Path:
        p = tmp_path / name
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8")
        return p

    return _write


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def two_type_problem() -> PlanningProblem:
    """3 jobs on 2 fast (v100, one node) + 3 slow (k80, two nodes) GPUs; no communication."""
    table = make_table({
        ("big", "v100"): (0.01, 0.002, 64), ("big", "k80"): (0.02, 0.008, 32),
        ("small", "v100"): (0.0, 0.004, 64), ("small", "k80"): (0.0, 0.010, 64),
    })
    cluster = make_cluster([("v100-1", "v100", 2), ("k80-1", "k80", 2), ("k80-2", "k80", 1)])
    jobs = [
        make_job("a", "big", dataset_size=64_000, global_batch=64),
        make_job("b", "small", dataset_size=12_800, global_batch=32, weight=2.0),
        make_job("c", "big", dataset_size=32_000, global_batch=64, arrival_s=20.0),
    ]
    return PlanningProblem(jobs, cluster, table)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts the real Slurm testbed carries the ``slurm`` marker, so
    ``make test-fast`` (``-m "not slurm and not slow"``) never starts one by accident."""
    for item in items:
        # the marker itself: item.keywords also holds the names of parent folders, and
        # every test under tests/slurm/ has "slurm" there, marked or not
        if "testbed" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
                "slurm"):
            item.add_marker(pytest.mark.slurm)
