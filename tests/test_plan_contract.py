"""The plan file contract: typed, validated, versioned, and carrying how it was made.

Everything after planning reads a plan through ``load_plan``; these tests hold
the contract at the level users meet it: files written by ``hetsched plan``
in a real subprocess, read back, submitted with ``--dry-run``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hetsched.app.plan import how_planned
from hetsched.core.plan import PlanSettings
from hetsched.errors import InputError
from hetsched.io.plan_json import NOTE_KEYS, json_schema, load_plan, plan_from_dict
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_cluster, load_jobs
from hetsched.planning.planner import make_plan

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "docs" / "plan.schema.json"


def _plan(examples: dict[str, Path], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["hetsched", "plan", str(examples["jobs"]), "--cluster", str(examples["cluster"]),
         "--throughputs", str(examples["throughputs"]), "--out", str(out),
         "--format", "json", *extra], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def plan_files(examples: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("plans")
    out = {"space": d / "space.json", "pool": d / "pool.json", "jps": d / "jps.json"}
    for mode, extra in (("space", ()), ("pool", ("--mode", "pool")),
                        ("jps", ("--static", "--restart-cost", "10", "--policy", "jps",
                                 "--param", "samples=80"))):
        r = _plan(examples, out[mode], *extra)
        assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["space", "pool"])
def test_round_trip_is_exact(plan_files: dict[str, Path], mode: str) -> None:
    """A plan read with load_plan writes back exactly what `hetsched plan` wrote."""
    raw = json.loads(plan_files[mode].read_text())
    plan = load_plan(plan_files[mode])
    assert plan.mode == mode
    assert plan.to_dict() == raw
    assert plan.settings is not None and plan.settings.mode == mode
    assert all(j.spec is not None and j.spec.name == j.name for j in plan.jobs)


def test_plan_records_how_it_was_made(plan_files: dict[str, Path]) -> None:
    plan = load_plan(plan_files["jps"])
    assert plan.settings == PlanSettings(mode="space", policy="jps", params={"samples": 80},
                                         static=True, restart_cost_s=10.0)


def test_replan_reuses_the_plans_settings(plan_files: dict[str, Path],
                                          examples: dict[str, Path]) -> None:
    """Replan of a --static --restart-cost 10 --policy jps --param samples=80 plan keeps all."""
    old = load_plan(plan_files["jps"])
    s = how_planned(old, None)
    assert s == old.settings
    new = make_plan(load_jobs(examples["jobs"])[:3], load_cluster(examples["cluster"]),
                    load_throughputs(examples["throughputs"]), jobs_source="replan",
                    **s.make_plan_kwargs())
    assert new.settings == old.settings
    assert new.policy == "jps" and new.static and new.restart_cost_s == 10.0
    assert new.params.get("samples") == 80
    # an explicit --policy on replan overrides the policy, not the rest
    o = how_planned(old, "fifo")
    assert (o.policy, o.params, o.static, o.restart_cost_s) == ("fifo", {}, True, 10.0)
    # pool plans are replanned in pool mode
    assert how_planned(load_plan(plan_files["pool"]), None).mode == "pool"


@pytest.mark.slow
def test_pool_plan_is_never_submitted_as_space_hetjobs(plan_files: dict[str, Path],
                                                       tmp_path: Path) -> None:
    r = subprocess.run(["hetsched", "submit", str(plan_files["pool"]), "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # one pool job running the executor per GPU, never per-job `hetsched run` hetjobs
    assert r.stdout.count("#!/bin/bash") == 1
    assert " exec --plan " in r.stdout and " run --plan " not in r.stdout
    assert "export HETSCHED_POOL_GPUS=" in r.stdout and "--job " not in r.stdout


@pytest.mark.parametrize("mutate, where, what", [
    (lambda d: d.update(version=2), "version", "unsupported plan version 2"),
    (lambda d: d["jobs"][0]["segments"][0]["workers"][0].update(local_batch="x"),
     "jobs[0].segments[0].workers[0].local_batch", "valid integer"),
    (lambda d: d["jobs"][1].update(name="a b"), "jobs[1].name", "should match pattern"),
    (lambda d: d["jobs"][0]["segments"][0]["workers"][0].update(node="n;id"),
     "jobs[0].segments[0].workers[0].node", "should match pattern"),
    (lambda d: d["jobs"][0]["spec"].update(workload="x\ny"), "workload", "letters, digits"),
    (lambda d: d["jobs"].append(dict(d["jobs"][0])), "name", "duplicate job name"),
    (lambda d: d["jobs"][0]["segments"][0].update(colour=1), "colour", "Extra inputs"),
    (lambda d: d.update(mode="pool", tasks=None), "tasks", "needs its 'tasks' section"),
    (lambda d: d.update(jobs=[]), "jobs", "at least 1 item"),
    (lambda d: d.update(batches={"a": 5}), "batches.a", "valid string"),
    (lambda d: d.update(no_group=["x"]), "no_group", "valid string"),
])
def test_bad_plans_get_one_line(plan_files: dict[str, Path], mutate, where: str,
                                what: str) -> None:
    d = json.loads(plan_files["space"].read_text())
    mutate(d)
    with pytest.raises(InputError) as e:
        plan_from_dict(d, "p.json")
    msg = str(e.value)
    assert msg.startswith("p.json") and where in msg and what in msg, msg
    assert "\n" not in msg


def test_notes_are_typed_fields_and_written_back(plan_files: dict[str, Path]) -> None:
    """The plan file's notes (replan_of, batches, skipped, ...) load as PlanNotes fields,
    not an open bag, and write back as the same top-level keys; unknown keys stay extra."""
    d = json.loads(plan_files["space"].read_text())
    first = d["jobs"][0]["name"]
    d.update(replan_of="0123456789abcdef", replanned_at=12.5,
             batches={first: "fedcba9876543210"}, no_group="no pair fits", custom={"k": 1})
    plan = plan_from_dict(d, "p.json")
    assert plan.notes.replan_of == "0123456789abcdef" and plan.notes.replanned_at == 12.5
    assert plan.notes.batches == {first: "fedcba9876543210"}
    assert plan.notes.no_group == "no pair fits"
    assert "batches" not in plan.extra and plan.extra["custom"] == {"k": 1}
    assert plan.to_dict() == d
    # every note is a declared, typed property of the published schema
    props = json_schema()["properties"]
    assert all(k in props for k in NOTE_KEYS)


def test_non_finite_numbers_are_refused(plan_files: dict[str, Path], tmp_path: Path) -> None:
    text = plan_files["space"].read_text().replace('"arrival_s": 0.0', '"arrival_s": NaN', 1)
    p = tmp_path / "nan.json"
    p.write_text(text)
    with pytest.raises(InputError, match="NaN is not a finite number"):
        load_plan(p)


def test_plans_match_the_published_schema(plan_files: dict[str, Path]) -> None:
    """Files `hetsched plan` writes (space and pool, the tasks section included) are
    instances of the schema; a pool row of the wrong shape is not."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    for mode in ("space", "pool"):
        jsonschema.validate(json.loads(plan_files[mode].read_text()), schema)
    bad = json.loads(plan_files["pool"].read_text())
    bad["tasks"]["gpus"][0]["runs"][0]["tasks"][0] = ["a", 0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_published_schema_is_current() -> None:
    """docs/plan.schema.json is generated from the models (python -m hetsched.io.plan_json)."""
    assert json.loads(SCHEMA.read_text()) == json_schema(), \
        "regenerate: python -m hetsched.io.plan_json > docs/plan.schema.json"
