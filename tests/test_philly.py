"""The Philly-derived trace generator: its draws follow the published distributions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from hetsched.core.problem import PlanningProblem
from hetsched.core.spec import Cluster, Node
from hetsched.io.philly import mean_duration_s, mean_gpus, philly_jobs
from hetsched.io.profiles import load_throughputs, parse_csv
from hetsched.io.specs import parse_jobs

CSV = Path(__file__).resolve().parent.parent / "examples" / "gavel_throughputs.csv"
ROWS = parse_csv(CSV.read_text(), str(CSV))


def _v100_step(wl: str, bs: int, s: int) -> float:
    return next(r.step_time_s for r in ROWS if (r.workload, r.gpu_type, r.local_batch, r.gpus)
                == (wl, "v100", bs, s) and r.colocated_with is None)


def test_published_moments() -> None:
    # E[10**U(1.5,3)] min = 968.38 / (1.5 ln 10) = 280.4; E[10**U(3,4)] = 9000 / ln 10 = 3908.7
    assert mean_duration_s() / 60 == pytest.approx(0.8 * 280.37 + 0.2 * 3908.65, rel=1e-4)
    assert mean_gpus() == pytest.approx(1.9)


def test_sizes_durations_and_gaps_follow_the_distributions() -> None:
    jobs = philly_jobs(ROWS, 4000, gpus=30, load=0.8, seed=7)
    sizes = np.array([j["requested_gpus"] for j in jobs])
    for s, p in ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05)):
        assert abs((sizes == s).mean() - p) < 0.025, s
    # duration on s V100s = iterations x the step time measured at s GPUs
    dur = np.array([j["dataset_size"] / j["global_batch"]
                    * _v100_step(j["workload"], j["global_batch"] // j["requested_gpus"],
                                 j["requested_gpus"]) for j in jobs])
    lm = np.log10(dur / 60)
    assert lm.min() >= 1.5 - 1e-3 and lm.max() <= 4 + 1e-3
    assert abs((lm >= 3).mean() - 0.2) < 0.025  # the long mode's share
    # inside the short mode log10(minutes) is uniform on [1.5, 3]: its quartiles
    short = np.sort(lm[lm < 3])
    assert np.quantile(short, [0.25, 0.5, 0.75]) == pytest.approx([1.875, 2.25, 2.625], abs=0.06)
    gaps = np.diff([j["arrival_s"] for j in jobs])
    want = mean_gpus() * mean_duration_s() / (0.8 * 30)
    assert gaps.mean() == pytest.approx(want, rel=0.06)
    assert np.std(gaps) / gaps.mean() == pytest.approx(1.0, abs=0.08)  # exponential: CV 1


def test_seeded_and_usable_by_the_planner() -> None:
    a = philly_jobs(ROWS, 30, gpus=30, seed=3)
    assert a == philly_jobs(ROWS, 30, gpus=30, seed=3)
    assert a != philly_jobs(ROWS, 30, gpus=30, seed=4)
    nodes = tuple(Node(f"{t}-{k}", t, 8) for t in ("v100", "p100", "k80") for k in range(2))
    p = PlanningProblem(parse_jobs(a, "philly"), Cluster(nodes=nodes), load_throughputs(CSV))
    assert len(p.jobs) == 30 and p.arrival[0] == 0.0


def test_colocated_measurements_do_not_set_durations() -> None:
    import dataclasses

    shared = [dataclasses.replace(r, step_time_s=r.step_time_s * 3, colocated_with="lm:5")
              for r in ROWS]  # a converter's co-located pair rows (Harmony): slower
    assert philly_jobs(ROWS + shared, 20, gpus=30) == philly_jobs(ROWS, 20, gpus=30)


def test_diurnal_modulation_puts_more_arrivals_in_the_peak_half_day() -> None:
    jobs = philly_jobs(ROWS, 3000, gpus=30, load=4.0, seed=1, diurnal=0.8)
    phase = np.array([j["arrival_s"] for j in jobs]) % 86400 / 86400
    # rate 1 + 0.8 sin: the first half-day gets (1 + 1.6/pi) / 2 = 75% of arrivals
    assert (phase < 0.5).mean() == pytest.approx(0.5 + 0.8 / math.pi, abs=0.04)
    with pytest.raises(ValueError):
        philly_jobs(ROWS, 3, gpus=30, diurnal=1.0)


@pytest.mark.slow
def test_convert_philly_trace_cli_writes_jobs_yaml_simulate_reads(tmp_path) -> None:
    import subprocess

    import yaml

    out = tmp_path / "philly.yaml"
    r = subprocess.run(["hetsched", "convert", "philly-trace", "--throughputs", str(CSV),
                        "--gpus", "30", "-n", "12", "--seed", "5", "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    jobs = yaml.safe_load(out.read_text())["jobs"]
    assert jobs == philly_jobs(ROWS, 12, gpus=30, seed=5)
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "name": "t", "network": {"intra_node_gbps": 300, "inter_node_gbps": 10},
        "nodes": [{"names": "v[1-2]", "gpu_type": "v100", "gpus": 8},
                  {"names": "k[1-2]", "gpu_type": "k80", "gpus": 8}]}))
    sim = subprocess.run(["hetsched", "simulate", str(out), "--cluster",
                          str(tmp_path / "cluster.yaml"), "--throughputs", str(CSV),
                          "--offline", "none"], capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr
    assert "alpha" in sim.stdout  # the default policy is opd
    bad = tmp_path / "k80only.csv"
    bad.write_text("workload,gpu_type,local_batch,step_time_s\nresnet-18,k80,32,0.1\n")
    r = subprocess.run(["hetsched", "convert", "philly-trace", "--throughputs", str(bad),
                        "--gpus", "30"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr
