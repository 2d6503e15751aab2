"""Profile history: schema migration, planner table, EWMA refinement, probes, workloads."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from hetsched.app.profile import default_batches, plan_probes
from hetsched.core.spec import Job
from hetsched.core.throughput import ProfileRow, ThroughputTable
from hetsched.errors import InputError
from hetsched.io.profiles import parse_csv
from hetsched.state import store as store_mod
from hetsched.state.history import (
    UNUSABLE,
    export_csv,
    forget,
    import_rows,
    ingest_reports,
    listing,
    set_status,
    table_from_store,
)
from hetsched.state.store import open_store


def _v1_file(path: Path) -> None:
    """A state file as schema version 1 wrote it, with one profile row."""
    conn = sqlite3.connect(path)
    for stmt in store_mod.SCHEMA.split(";"):
        if stmt.strip():
            conn.execute(stmt)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [
        ("application", "hetsched"), ("schema_version", "1"), ("created", "0")])
    conn.execute("INSERT INTO profiles VALUES ('mlp','a100',8,0.1,NULL,'csv',0)")
    conn.commit()
    conn.close()


def test_migrates_a_version_1_file(tmp_path: Path) -> None:
    p = tmp_path / "state.db"
    _v1_file(p)
    with open_store(p) as st:
        assert st.schema_version == store_mod.SCHEMA_VERSION == 3
        assert st.profiles()[0]["step_time_s"] == 0.1
        assert st.profiles()[0]["samples"] == 1
        set_status(st, "mlp", "a100", "ok")
    with open_store(p) as st:  # reopening does not migrate twice
        assert st.schema_version == 3


def _rows(w: str, g: str, a: float, c: float) -> list[ProfileRow]:
    return [ProfileRow(w, g, b, a + c * b, 0.001, 64) for b in (8, 16, 32)]


def test_table_from_store_leaves_out_unusable_pairs(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.db") as st:
        with pytest.raises(InputError, match="profile history .* is empty"):
            table_from_store(st)
        import_rows(st, _rows("mlp", "a100", 0.01, 0.001) + _rows("mlp", "t4", 0.02, 0.004),
                    "test")
        set_status(st, "mlp", "t4", UNUSABLE, "probe timed out")
        t = table_from_store(st)
        fit = t.get("mlp", "a100")
        assert fit is not None and fit.a == pytest.approx(0.01) and fit.c == pytest.approx(0.001)
        assert fit.max_batch == 64 and t.get("mlp", "t4") is None
        rows = parse_csv(export_csv(st), "export")
        assert {r.gpu_type for r in rows} == {"a100"} and rows[0].max_local_batch == 64
        assert {r["gpu_type"]: r["status"] for r in listing(st)} == {"a100": "ok",
                                                                     "t4": UNUSABLE}
        assert forget(st, gpu_type="a100") == 3
        assert [r["gpu_type"] for r in listing(st)] == ["t4"]
        # every pair probed failed: the error says so, not "empty; run hetsched profile"
        with pytest.raises(InputError, match=r"has no usable profile: every pair probed was "
                           r"marked unusable \(mlp/t4\); `hetsched profiles list` says why"):
            table_from_store(st)


def test_ewma_refinement_counts_each_report_line_once(tmp_path: Path) -> None:
    rep = tmp_path / "job.jsonl"

    def line(compute: float, b: int = 16) -> str:
        return json.dumps({"kind": "steps", "workload": "mlp", "gpu_type": "a100",
                           "local_batch": b, "compute_s": compute, "sync_s": 0.002,
                           "world_size": 2}) + "\n"

    with open_store(tmp_path / "s.db") as st:
        import_rows(st, _rows("mlp", "a100", 0.01, 0.001), "probe")  # b=16: 0.026 s
        rep.write_text(line(0.036) + line(0.020, b=24) + '{"kind": "epoch"}\n' + '{"torn')
        ch = ingest_reports(st, [rep], alpha=0.5)
        assert [(b, old, round(new, 6)) for _, _, b, old, new in ch] == [
            (16, pytest.approx(0.026), 0.031), (24, None, 0.02)]
        assert ingest_reports(st, [rep], alpha=0.5) == []  # nothing new
        with rep.open("a") as f:
            f.write('": 1}\n' + line(0.041))
        ch = ingest_reports(st, [rep], alpha=0.5)
        assert [round(new, 6) for *_, new in ch] == [0.036]
        row = {r["local_batch"]: r for r in st.profiles()}[16]
        assert row["samples"] == 3 and row["source"].startswith("ewma:")
        assert row["max_local_batch"] == 64


def test_plan_probes_skips_history_unusable_and_unprobeable(tmp_path: Path) -> None:
    jobs = [Job("a", "mlp", 100, 1, 32), Job("b", "cnn", 100, 1, 16, gpu_types=("v100",)),
            Job("c", "resnet-50", 100, 1, 32, command=("train.py",)),
            Job("d", "mine", 100, 1, 8, entrypoint="pkg.mod:build")]
    with open_store(tmp_path / "s.db") as st:
        import_rows(st, _rows("mlp", "a100", 0.01, 0.001), "probe")
        set_status(st, "mlp", "v100", UNUSABLE, "timed out")
        specs, skipped = plan_probes(jobs, ["a100", "v100"], st)
        got = {(s.workload, s.gpu_type): s for s in specs}
        assert set(got) == {("cnn", "v100"), ("mine", "a100"), ("mine", "v100")}
        assert got[("mine", "a100")].entrypoint == "pkg.mod:build"
        assert got[("cnn", "v100")].batches == (2, 4, 8, 16)
        assert skipped["mlp/a100"] == "history"
        assert skipped["mlp/v100"].startswith("unusable (timed out")
        assert "nothing to probe" in skipped["resnet-50/a100"]
        specs, _ = plan_probes(jobs, ["a100", "v100"], st, retry_unusable=True)
        assert ("mlp", "v100") in {(s.workload, s.gpu_type) for s in specs}


def test_plan_probes_one_probe_per_workload_from_all_its_jobs(tmp_path: Path) -> None:
    """Jobs sharing a workload share its probe, whatever order the file lists them in."""
    from hetsched.core.sbatch import SbatchOptions

    jobs = [Job("plain", "resnet-18", 100, 1, 32),
            Job("late", "resnet-18", 100, 1, 128, entrypoint="pkg.mod:build",
                slurm=SbatchOptions(cpus_per_gpu=4)),
            Job("big", "resnet50", 100, 1, 64)]
    seen: list[str] = []
    with open_store(tmp_path / "s.db") as st:
        specs, skipped = plan_probes(jobs, ["v100"], st, warn=seen.append)
    got = {s.workload: s for s in specs}
    assert set(got) == {"resnet-18", "resnet50"}  # resnet50 is a runtime built-in
    assert skipped == {}  # the job without an entrypoint does not mark its workload unprobeable
    assert got["resnet-18"].entrypoint == "pkg.mod:build"
    assert got["resnet-18"].batches == default_batches(128)  # the largest global batch
    assert got["resnet-18"].cpus == 4
    assert seen == []
    other = Job("other", "resnet-18", 100, 1, 32, entrypoint="pkg.other:build")
    specs, _ = plan_probes([*jobs, other], ["v100"], None, warn=seen.append)
    assert [s.entrypoint for s in specs if s.workload == "resnet-18"] == ["pkg.mod:build"]
    assert len(seen) == 1 and "late (pkg.mod:build), other (pkg.other:build)" in seen[0]


def test_nothing_to_probe_says_why() -> None:
    from hetsched.app.profile import nothing_to_probe

    line = nothing_to_probe({"a/v100": "history", "b/v100": "unusable (timed out)",
                             "c/v100": "job 'c' has no entrypoint ..."})
    assert line == ("nothing to probe: of 3 (workload, GPU type) pairs, 1 have history, "
                    "1 are marked unusable (--retry-unusable probes them), "
                    "1 cannot be probed (see above)")
    assert "no job may use" in nothing_to_probe({})


def test_profile_with_nothing_probeable_says_so(tmp_path: Path) -> None:
    """`hetsched profile` on jobs it cannot probe: each pair's reason, then one true line."""
    import subprocess

    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - {name: a, workload: resnet-18, dataset_size: 100, epochs: 1, "
        "global_batch: 32}\n")
    (tmp_path / "c.yaml").write_text("nodes:\n  - {name: n1, gpu_type: v100, gpus: 2}\n")
    env = {**__import__("os").environ, "HETSCHED_STATE": str(tmp_path / "s.db")}
    r = subprocess.run([sys.executable, "-m", "hetsched", "profile", str(tmp_path / "jobs.yaml"),
                        "--cluster", str(tmp_path / "c.yaml")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "skip resnet-18/v100: job 'a' has no entrypoint and 'resnet-18' is not a built-in" \
        in r.stderr
    assert r.stdout.strip() == ("nothing to probe: of 1 (workload, GPU type) pairs, "
                                "1 cannot be probed (see above)")


def test_default_batches() -> None:
    assert default_batches(48) == (2, 4, 8, 32, 48)
    assert default_batches(1000) == (2, 8, 32, 256, 1000)
    assert default_batches(1) == (2,)


@pytest.mark.slow
def test_probe_measures_rows_with_emulated_speed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulation sleeps to its step time (0.2 s + 0.04 s a sample, halved on "fast"),
    so a row is never below it. The two types are compared with each other, not with a
    clock, and the emulated steps are long enough that one step a busy machine delays by
    a few hundred milliseconds cannot reverse them."""
    pytest.importorskip("torch")
    from hetsched.runtime.probe import probe

    monkeypatch.setenv("HETSCHED_EMULATE_SPEED", "fast=2,slow=1")
    monkeypatch.setenv("HETSCHED_EMULATE_COST", "0.2,0.04")
    res = {g: probe("mlp", g, [4, 16], warmup=1, steps=3, device="cpu") for g in ("fast", "slow")}
    for g, speed in (("fast", 2), ("slow", 1)):
        rows = {r.local_batch: r for r in res[g].rows if r.gpus == 1}
        # a CPU says nothing about GPU memory: no max_local_batch (the batch bound stays 16)
        assert set(rows) == {4, 16} and rows[4].max_local_batch is None and res[g].max_batch == 16
        assert rows[16].step_time_s >= (0.2 + 0.64) / speed * 0.999
        assert rows[4].sync_time_s is not None and rows[4].sync_time_s > 0
        # sync measured at 2 and 4 ranks: whole-iteration rows the model calibrates from
        multi = {r.gpus: r for r in res[g].rows if r.gpus > 1}
        assert set(multi) == {2, 4}
        for r in multi.values():
            assert r.local_batch == 16 and r.sync_time_s is not None and r.sync_time_s > 0
            assert r.step_time_s == pytest.approx(rows[16].step_time_s + r.sync_time_s)
    # 0.84 s against 0.42 s emulated: above 1.3x unless the machine adds 0.98 s a step
    assert res["slow"].rows[1].step_time_s > 1.3 * res["fast"].rows[1].step_time_s


def test_entrypoint_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from hetsched.runtime.workloads import load_workload

    (tmp_path / "userwl.py").write_text(
        "import torch\n"
        "def build(dataset_size):\n"
        "    m = torch.nn.Linear(4, 2)\n"
        "    ds = torch.utils.data.TensorDataset(torch.randn(dataset_size, 4),\n"
        "                                        torch.zeros(dataset_size, dtype=torch.long))\n"
        "    return {'model': m, 'dataset': ds, 'loss_fn': torch.nn.functional.cross_entropy,\n"
        "            'optimizer': lambda p: torch.optim.SGD(p, lr=0.1)}\n"
        "def bad():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    wl = load_workload("anything", entrypoint="userwl:build", dataset_size=10)
    assert len(wl.dataset) == 10  # type: ignore[arg-type]
    with pytest.raises(InputError, match="returned int"):
        load_workload("x", entrypoint="userwl:bad")
    with pytest.raises(InputError, match="cannot import"):
        load_workload("x", entrypoint="no_such_mod_xyz:f")
    with pytest.raises(InputError, match="not a built-in workload"):
        load_workload("resnet-50")
    sys.modules.pop("userwl", None)


class _FakeClient:
    """Stands in for Slurm only to drive run_probes' bookkeeping (the real path is
    tests/slurm/test_e2e_runtime.py): job 1 finishes with results, job 2 never ends."""

    def __init__(self, queued: str = "") -> None:
        from hetsched.slurm.client import JobInfo

        self.Job = JobInfo
        self.queued = queued  # a GPU type whose probe never leaves the queue
        self.n = 0
        self.cancelled: list[str] = []
        self.scripts: dict[str, str] = {}

    def submit(self, script: str, extra_args: tuple[str, ...] = ()) -> str:
        self.n += 1
        if "t4" in Path(script).name:
            raise RuntimeError("sbatch: error: invalid generic resource (gres) specification")
        self.scripts[str(self.n)] = script
        return str(self.n)

    def jobs(self) -> list[object]:
        out = []
        for jid, script in self.scripts.items():
            if "a100" in Path(script).name:
                Path(script).with_suffix(".csv").write_text(
                    "workload,gpu_type,local_batch,step_time_s\nmlp,a100,8,0.02\nmlp,a100,16,0.03\n")
                out.append(self.Job(jid, "p", "COMPLETED"))
            elif jid not in self.cancelled:
                queued = self.queued and self.queued in Path(script).name
                out.append(self.Job(jid, "p", "PENDING" if queued else "RUNNING",
                                    reason="Resources" if queued else ""))
        return out

    def cancel(self, ids: list[str]) -> None:
        self.cancelled.extend(ids)


def test_run_probes_marks_failed_and_timed_out_pairs_unusable(tmp_path: Path) -> None:
    from hetsched.app.probe_run import run_probes
    from hetsched.app.profile import ProbeSpec, render_probes
    from hetsched.state.history import statuses

    specs = [ProbeSpec("mlp", g, (8, 16)) for g in ("a100", "v100", "t4")]
    client = _FakeClient()
    with open_store(tmp_path / "s.db") as st:
        outs = render_probes(specs, tmp_path / "files", partition=None, time_limit_s=0.3,
                             warmup=1, steps=1, hetsched="hetsched")
        text = outs[0].script.read_text()  # type: ignore[union-attr]
        assert "#SBATCH --gres=gpu:a100:1" in text and "#SBATCH --time=2" in text
        assert "--time-limit 0.3" in text
        run_probes(outs, client, st, time_limit_s=0.3, queue_wait_s=5, poll_s=0.05,
                   grace_s=0.1)
        got = {g: (s["status"], s["reason"]) for (_, g), s in statuses(st).items()}
    assert got["a100"][0] == "ok"
    assert got["v100"][0] == UNUSABLE and "timed out" in got["v100"][1]
    assert got["t4"][0] == UNUSABLE and "sbatch failed" in got["t4"][1]
    assert client.cancelled == ["2"]


def test_a_probe_that_never_left_the_queue_records_nothing(tmp_path: Path) -> None:
    """A busy cluster's queue says nothing about a pair: marking it unusable made `plan`
    leave that GPU type out for the workload, and the next `profile` skip it."""
    from hetsched.app.probe_run import run_probes
    from hetsched.app.profile import NOT_RUN, ProbeSpec, plan_probes, render_probes
    from hetsched.core.spec import Job
    from hetsched.state.history import statuses

    specs = [ProbeSpec("mlp", g, (8, 16)) for g in ("a100", "v100")]
    client = _FakeClient(queued="v100")
    with open_store(tmp_path / "s.db") as st:
        outs = render_probes(specs, tmp_path / "files", partition=None, time_limit_s=5,
                             warmup=1, steps=1, hetsched="hetsched")
        outs = run_probes(outs, client, st, time_limit_s=5, queue_wait_s=0.2, poll_s=0.05)
        by = {o.spec.gpu_type: o for o in outs}
        assert by["v100"].status == NOT_RUN and "pending after 0.2 s" in by["v100"].reason
        assert "(Resources)" in by["v100"].reason and client.cancelled == ["2"]
        assert {g for (_, g) in statuses(st)} == {"a100"}  # nothing for v100
        job = Job(name="j", workload="mlp", dataset_size=100, epochs=1, global_batch=16)
        again, _ = plan_probes([job], ["a100", "v100"], st)
        assert [s.gpu_type for s in again] == ["v100"]  # probed again next time


def test_a_probe_row_slower_than_a_larger_batch_is_left_out() -> None:
    """Noise only adds time: a small batch measured far slower than a larger one was
    disturbed (the testbed's probes start together on shared cores). Kept, that one row
    made the planner's monotone curve flat at 163 ms where the job ran at 12 ms."""
    from hetsched.app.profile import plausible_rows

    def row(b: int, t: float, gpus: int = 1) -> ProfileRow:
        return ProfileRow("mlp", "v100", b, t, gpus=gpus)

    sweep = [row(2, 0.781), row(4, 0.000366), row(8, 0.000445), row(32, 0.0191),
             row(64, 0.0137), row(16, 0.05, gpus=2)]
    kept, dropped = plausible_rows(sweep)
    assert [(r.local_batch, r.gpus) for r in kept] == [(4, 1), (8, 1), (32, 1), (64, 1),
                                                       (16, 2)]
    assert dropped == ["batch 2: 0.781 s, slower than batch 4's 0.000366 s"]
    clean = [row(2, 0.010), row(4, 0.011), row(8, 0.009), row(32, 0.030), row(64, 0.055)]
    assert plausible_rows(clean) == (clean, [])  # flat small batches and noise stay
    table = ThroughputTable(kept)
    assert table.fits[("mlp", "v100")].step_time(64) < 0.02  # not the 0.16 s of the mean


def test_import_keeps_one_gpus_step_and_leaves_out_rows_of_several_gpus(tmp_path: Path) -> None:
    """A probe ends with one whole-iteration row per scale at its largest batch (compute
    and exchange, ``gpus`` 2 and 4). The history keeps one row per (workload, GPU type,
    batch), so stored, the last of them replaced that batch's one-GPU step."""
    from hetsched.state.history import one_gpu_step

    single = _rows("mlp", "a100", 0.01, 0.001)  # b = 8, 16, 32: 0.018, 0.026, 0.042 s
    several = [ProfileRow("mlp", "a100", 32, 0.042 + v, v, 64, gpus=k)
               for k, v in ((2, 0.005), (4, 0.009))]
    pair = [ProfileRow("mlp", "a100", 32, 0.07, colocated_with="cnn:16")]
    rows = single + several + pair
    with open_store(tmp_path / "s.db") as st:
        assert import_rows(st, rows, "probe") == 3
        steps = {r.local_batch: r.step_time_s for r in table_from_store(st).all_rows()}
    assert steps == pytest.approx({8: 0.018, 16: 0.026, 32: 0.042})
    assert [one_gpu_step(r) for r in rows] == [True] * 3 + [False] * 3


def test_profiles_import_of_gavels_rows_says_what_it_left_out(tmp_path: Path) -> None:
    """`hetsched profiles import` of the bundled Gavel CSV, then `export`: each step is
    Gavel's one-GPU measurement (lm on a K80 at batch 5: 0.039238 s; its 8-GPU row,
    0.104081 s, had replaced it), and the command says what it left out and why."""
    import os
    import subprocess

    csv_file = Path(__file__).resolve().parents[2] / "examples" / "gavel_throughputs.csv"
    env = {**os.environ, "HETSCHED_STATE": str(tmp_path / "s.db")}

    def run(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "hetsched", "profiles", *args],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    said = run("import", str(csv_file))
    assert said.strip() == (
        "imported 72 rows; left out 168 of several GPUs and 1597 of co-located pairs (the "
        "history keeps one GPU's step; plan with --throughputs gavel_throughputs.csv to use "
        "them)")
    exported = {tuple(line.split(",")[:3]): float(line.split(",")[3])
                for line in run("export").splitlines()[1:]}
    assert exported[("lm", "k80", "5")] == pytest.approx(0.039238)
    assert len(exported) == 72
