"""`hetsched plan`, `policies` and `convert` end to end, in-process with click's CliRunner."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
import yaml

from hetsched.cli.main import main
from hetsched.io.profiles import load_throughputs
from hetsched.io.specs import load_jobs
from hetsched.planning.space.policies.base import REGISTRY


def plan_args(examples, *extra: str) -> list[str]:
    return ["plan", str(examples["jobs"]), "--cluster", str(examples["cluster"]),
            "--throughputs", str(examples["throughputs"]), *extra]


@pytest.fixture(scope="module")
def plan_json(examples) -> dict:
    from click.testing import CliRunner

    res = CliRunner().invoke(main, plan_args(examples, "--format", "json"))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_plan_json_has_the_contract_keys(plan_json, examples) -> None:
    d = plan_json
    assert d["version"] == 1
    assert isinstance(d["policy"], str) and d["policy"].startswith("auto:")
    for k in ("weighted_jct_s", "avg_jct_s", "makespan_s"):
        assert isinstance(d["objective"][k], float)
    assert isinstance(d["lower_bound"]["weighted_jct_s"], float)
    specs = {j.name: j for j in load_jobs(examples["jobs"])}
    assert [j["name"] for j in d["jobs"]] == list(specs)
    for j in d["jobs"]:
        for k, typ in (("name", str), ("weight", float), ("arrival_s", float),
                       ("start_s", float), ("end_s", float), ("segments", list)):
            assert isinstance(j[k], typ), (j["name"], k)
        spec = specs[j["name"]]
        assert j["weight"] == spec.weight and j["arrival_s"] == spec.arrival_s
        assert j["arrival_s"] <= j["start_s"] <= j["end_s"]
        assert j["start_s"] == j["segments"][0]["start_s"]
        assert j["end_s"] == j["segments"][-1]["end_s"]
        for seg in j["segments"]:
            assert isinstance(seg["start_s"], float) and isinstance(seg["end_s"], float)
            assert sum(w["local_batch"] for w in seg["workers"]) == spec.global_batch
            for w in seg["workers"]:
                assert set(w) >= {"node", "gpu_type", "gpu", "local_batch"}
                assert isinstance(w["node"], str) and isinstance(w["gpu_type"], str)
                assert isinstance(w["gpu"], int) and isinstance(w["local_batch"], int)


def test_plan_json_objective_is_what_the_jobs_say(plan_json) -> None:
    """JCT = end_s - arrival_s; the objective follows from the jobs (to the JSON's rounding)."""
    jobs = plan_json["jobs"]
    jct = [j["end_s"] - j["arrival_s"] for j in jobs]
    obj = plan_json["objective"]
    assert obj["weighted_jct_s"] == pytest.approx(
        sum(j["weight"] * x for j, x in zip(jobs, jct, strict=True)), abs=1e-4)
    assert obj["avg_jct_s"] == pytest.approx(sum(jct) / len(jct), abs=1e-4)
    assert obj["makespan_s"] == pytest.approx(
        max(j["end_s"] for j in jobs) - min(j["arrival_s"] for j in jobs), abs=1e-4)
    for j, x in zip(jobs, jct, strict=True):
        assert j["jct_s"] == pytest.approx(x, abs=1e-5)
    assert plan_json["lower_bound"]["weighted_jct_s"] <= obj["weighted_jct_s"]
    # auto reports every candidate and keeps the best
    cands = plan_json["candidates"]
    assert obj["weighted_jct_s"] == pytest.approx(min(cands.values()), abs=1e-4)
    assert plan_json["policy"] == "auto:" + min(cands, key=cands.get)


def test_plan_json_gpus_are_real_and_never_double_booked(plan_json, examples) -> None:
    nodes = {}
    for n in yaml.safe_load(examples["cluster"].read_text())["nodes"]:
        from hetsched.io.specs import expand_hostlist

        for name in expand_hostlist(n["names"], "x", "y"):
            nodes[name] = (n["gpu_type"], n["gpus"])
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for j in plan_json["jobs"]:
        for seg in j["segments"]:
            for w in seg["workers"]:
                assert nodes[w["node"]][0] == w["gpu_type"]
                assert 0 <= w["gpu"] < nodes[w["node"]][1]
                spans.setdefault((w["node"], w["gpu"]), []).append((seg["start_s"], seg["end_s"]))
    for s in spans.values():
        s.sort()
        assert all(b[0] >= a[1] - 1e-5 for a, b in zip(s, s[1:], strict=False))


def test_plan_yaml_equals_json(runner, examples, plan_json) -> None:
    res = runner.invoke(main, plan_args(examples, "--format", "yaml"))
    assert res.exit_code == 0, res.output
    d = yaml.safe_load(res.stdout)
    assert d["version"] == 1
    assert d["objective"]["weighted_jct_s"] == plan_json["objective"]["weighted_jct_s"]
    assert [j["end_s"] for j in d["jobs"]] == [j["end_s"] for j in plan_json["jobs"]]


def test_plan_table_out_and_gantt(runner, examples, tmp_path) -> None:
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    res = runner.invoke(main, plan_args(examples, "--policy", "optimus-lb", "--out", str(out),
                                        "--gantt", str(png)))
    assert res.exit_code == 0, res.output
    for name in ("resnet50-imagenet", "recsys-ml20m", "resnet18-late"):
        assert name in res.stdout
    assert "lower bound" in res.stdout.lower()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    d = json.loads(out.read_text())
    assert d["policy"] == "optimus-lb"
    # the written plan is the same plan that --format json prints
    res2 = runner.invoke(main, plan_args(examples, "--policy", "optimus-lb", "--format", "json"))
    assert json.loads(res2.stdout)["plan_id"] == d["plan_id"]


def test_plan_static_and_params(runner, examples) -> None:
    res = runner.invoke(main, plan_args(examples, "--policy", "jps", "--param", "samples=7",
                                        "--param", "seed=2", "--static", "--restart-cost", "30",
                                        "--format", "json"))
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["params"]["samples"] == 7 and d["params"]["seed"] == 2
    assert d["static"] is True and d["restart_cost_s"] == 30.0
    assert all(len(j["segments"]) == 1 for j in d["jobs"])


def test_policies_lists_every_registered_policy(runner) -> None:
    res = runner.invoke(main, ["policies", "--format", "json"])
    assert res.exit_code == 0
    listed = json.loads(res.stdout)
    rows = {r["name"]: r for r in listed if r["mode"] == "space"}
    assert set(rows) == set(REGISTRY) | {"auto"}
    from hetsched.planning.pool import POOL_POLICIES

    pool = {r["name"] for r in listed if r["mode"] == "pool"}
    assert pool == set(POOL_POLICIES) | {"auto"}
    assert set(REGISTRY) >= {"has", "jps", "optimus", "optimus-lb", "fifo", "srtf", "allox",
                             "homo", "exhaustive"}
    assert set(rows["jps"]["parameters"]) >= {"alpha", "beta", "samples", "seed"}
    assert rows["jps"]["parameters"]["alpha"]["default"] == 0.7
    assert all(rows[n]["paper"] for n in REGISTRY)
    table = runner.invoke(main, ["policies"])
    assert table.exit_code == 0
    for name in REGISTRY:
        assert name in table.stdout


def test_convert_gavel_throughputs(runner, gavel_data, tmp_path, examples) -> None:
    out = tmp_path / "gavel.csv"
    res = runner.invoke(main, ["convert", "gavel-throughputs",
                               str(gavel_data / "simulation_throughputs.json"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert {r["gpu_type"] for r in rows} == {"k80", "p100", "v100"}
    assert {r["workload"] for r in rows} >= {"resnet-18", "resnet-50", "transformer", "lm",
                                             "recommendation"}
    raw = json.loads((gavel_data / "simulation_throughputs.json").read_text())
    for scale in (1, 2, 4, 8):  # every measured scale is kept
        its = raw["v100"][f"('ResNet-18 (batch size 64)', {scale})"]["null"]
        (row,) = [r for r in rows if (r["workload"], r["gpu_type"], r["local_batch"], r["gpus"])
                  == ("resnet-18", "v100", "64", str(scale)) and not r["colocated_with"]]
        # Gavel's rate at scale s sums the s workers' steps: one iteration takes s / rate
        assert float(row["step_time_s"]) == pytest.approx(scale / its, rel=1e-5)
    table = load_throughputs(out)
    fit = table.get("resnet-50", "v100")
    assert fit is not None and fit.a >= 0 and fit.c > 0
    # communication calibrated from the multi-GPU measurements, growing with the scale
    assert [k for k, _ in fit.sync_curve] == [2, 4, 8]
    assert fit.sync_at(2) <= fit.sync_at(4) <= fit.sync_at(8) and fit.sync_at(8) > 0
    # the bundled example CSV is this conversion
    assert out.read_text() == examples["throughputs"].read_text()
    # to stdout as well
    res = runner.invoke(main, ["convert", "gavel-throughputs",
                               str(gavel_data / "simulation_throughputs.json")])
    assert res.stdout == out.read_text()


def test_convert_gavel_trace_and_plan_it(runner, gavel_data, tmp_path, examples) -> None:
    trace = gavel_data / "traces" / "small_test.trace"
    if not trace.is_file():
        pytest.skip(f"{trace} not found")
    out = tmp_path / "jobs.yaml"
    res = runner.invoke(main, ["convert", "gavel-trace", str(trace), "-o", str(out)])
    assert res.exit_code == 0, res.output
    jobs = load_jobs(out)
    lines = [ln.split("\t") for ln in trace.read_text().splitlines() if ln.strip()]
    with_batch = [f for f in lines if "(batch size" in f[0]]
    assert len(jobs) == len(with_batch)
    assert f"skipped {len(lines) - len(with_batch)} job(s)" in res.stderr
    assert any(int(f[6]) > 1 for f in with_batch)  # the trace has multi-GPU jobs
    for f, j in zip(with_batch, jobs, strict=True):
        bs, scale = int(f[0].split("batch size ")[1].rstrip(")")), int(f[6])
        assert j.global_batch == bs * scale  # batch x scale factor
        # the trace's steps are summed over the s workers: steps / s synchronous iterations
        # (Gavel's generate_job: num_steps = duration x aggregate throughput at scale s)
        assert j.dataset_size == int(f[5]) * bs
        assert j.iterations == math.ceil(int(f[5]) / scale)
        assert j.requested_gpus == scale
        assert j.arrival_s == float(f[9])
    # the converted jobs plan on the example cluster with the Gavel profiles
    short = tmp_path / "few.yaml"
    res = runner.invoke(main, ["convert", "gavel-trace", str(trace), "--limit", "4",
                               "-o", str(short)])
    assert len(load_jobs(short)) == 4
    res = runner.invoke(main, ["plan", str(short), "--cluster", str(examples["cluster"]),
                               "--throughputs", str(examples["throughputs"]),
                               "--policy", "optimus-lb", "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert len(d["jobs"]) == 4
    assert all(math.isfinite(j["end_s"]) for j in d["jobs"])
