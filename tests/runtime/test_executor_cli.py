"""`hetsched exec` as a user meets it: refuses space plans, runs a pool plan locally,
writes per-GPU reports the reader folds, checkpoints each job per round."""

from __future__ import annotations

from pathlib import Path

import pytest
from exec_helpers import hetsched, make_plan, plan_json

from hetsched.io.plan_json import load_plan
from hetsched.io.pool_reports import completed_rounds, read_pool_reports

pytestmark = pytest.mark.slow  # multi-process torch: `make test`, not `make test-fast`


def test_refuses_a_space_plan(tmp_path: Path) -> None:
    (tmp_path / "jobs.yaml").write_text("jobs:\n  - {name: a, workload: mlp, dataset_size: 64, "
                                        "epochs: 1, global_batch: 8}\n")
    from exec_helpers import cluster_yaml, throughputs

    (tmp_path / "cluster.yaml").write_text(cluster_yaml(1))
    (tmp_path / "tp.csv").write_text(throughputs())
    r = hetsched("plan", str(tmp_path / "jobs.yaml"), "--cluster", str(tmp_path / "cluster.yaml"),
                 "--throughputs", str(tmp_path / "tp.csv"), "--out", str(tmp_path / "space.json"))
    assert r.returncode == 0, r.stderr
    r = hetsched("exec", "--plan", str(tmp_path / "space.json"), "--local")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pool plans" in lines[0] and "space-mode" in lines[0], r.stderr


def test_local_run_reports_and_checkpoints(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, gpus=2, task_iterations=2)
    rep, ck = tmp_path / "rep", tmp_path / "ck"
    r = hetsched("exec", "--plan", str(plan), "--local", "--report-dir", str(rep),
                 "--checkpoint-dir", str(ck))
    assert r.returncode == 0, r.stderr
    d = plan_json(plan)
    pid, tasks = d["plan_id"], d["tasks"]
    files = sorted(p.name for p in (rep / pid).iterdir())
    assert files == sorted(f"gpu-{g['node']}-g{g['gpu']}.jsonl" for g in tasks["gpus"])
    prog = read_pool_reports(rep, pid, {j: v["tasks_per_round"] for j, v in tasks["jobs"].items()})
    assert sum(j.tasks_done for j in prog.jobs.values()) == tasks["total_tasks"]
    for name, j in tasks["jobs"].items():
        jp = prog.jobs[name]
        assert jp.done and jp.rounds_done == j["rounds"]
        assert jp.tasks_done == j["rounds"] * j["tasks_per_round"]
        # every sample of the job's epoch trained exactly once
        spec = next(x for x in d["jobs"] if x["name"] == name)["spec"]
        assert jp.samples == spec["dataset_size"] * spec["epochs"]
    keys = {"kind", "job", "round", "task", "gpu", "gpu_type", "iterations", "samples",
            "compute_s", "switch_s", "start", "end"}
    assert all(keys <= set(t) for t in prog.tasks)
    assert completed_rounds(load_plan(plan), ck) == {n: j["rounds"]
                                                     for n, j in tasks["jobs"].items()}


def test_emulated_speeds_make_tasks_take_the_modelled_time(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from typing import Any

    from hetsched.runtime.executor.entry import run_threads
    from hetsched.runtime.executor.plan import exec_plan

    monkeypatch.setenv("HETSCHED_EMULATE_SPEED", "v100=2,k80=0.5")
    monkeypatch.setenv("HETSCHED_EMULATE_COST", "0.02,0.005")
    plan = make_plan(tmp_path, gpus=2, task_iterations=2)
    xp = exec_plan(load_plan(plan))
    seen: list[dict[str, Any]] = []
    res = run_threads(str(plan), {"seed": 0, "on_task": seen.append})
    assert all(isinstance(r, dict) for r in res), res
    speed = {"v100": 2.0, "k80": 0.5}
    for r in seen:  # one emulated pass per group of steps the plan's chunk fuses
        job = xp.jobs[r["job"]]
        counts = job.task_counts(r["round"], r["task"])
        passes = [sum(counts[k] for k in g)
                  for g in job.passes(r["round"], r["task"], r["gpu_type"])]
        assert r["iterations"] == len(passes) and r["samples"] == sum(counts)
        want = sum((0.02 + 0.005 * n) / speed[r["gpu_type"]] for n in passes if n)
        assert want <= r["compute_s"] < want + 0.25, (r, want)


def test_checkpoint_interval_skips_intermediate_rounds_but_not_the_last(tmp_path: Path
                                                                        ) -> None:
    import json
    from typing import Any

    from hetsched.runtime.executor.entry import run_threads

    plan = make_plan(tmp_path, gpus=2, task_iterations=1)
    d = plan_json(plan)
    ck = tmp_path / "ck"
    seen: list[dict[str, int]] = []

    def look(_rec: dict[str, Any]) -> None:
        for name in d["tasks"]["jobs"]:
            side = ck / d["plan_id"] / f"{name}.json"
            if side.exists():
                seen.append({name: json.loads(side.read_text())["rounds_done"]})

    res = run_threads(str(plan), {"checkpoint_dir": str(ck), "checkpoint_every_s": 3600.0,
                                  "on_task": look})
    assert all(isinstance(r, dict) for r in res), res
    rounds = {n: j["rounds"] for n, j in d["tasks"]["jobs"].items()}
    assert min(rounds.values()) > 1
    assert all(v == rounds[k] for s in seen for k, v in s.items())  # only final checkpoints
    assert completed_rounds(load_plan(plan), ck) == rounds
