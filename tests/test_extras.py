"""Missing optional dependencies end in one line naming the extra, not a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BLOCK = ("import sys; sys.modules[{mod!r}] = None; sys.argv = {argv!r}; "
         "from hetsched.cli import main; main()")


def _run_without(mod: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(mod=mod, argv=["hetsched", *argv])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_run_without_torch_names_the_runtime_extra(tmp_path: Path) -> None:
    workers = [{"node": "n1", "gpu_type": "v100", "gpu": 0, "local_batch": 8}]
    plan = {"version": 1, "policy": "test", "lower_bound": {"weighted_jct_s": 1.0},
            "jobs": [{"name": "j", "weight": 1.0, "arrival_s": 0.0,
                      "spec": {"workload": "mlp", "dataset_size": 64, "epochs": 1,
                               "global_batch": 8},
                      "segments": [{"start_s": 0.0, "end_s": 1.0, "workers": workers}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    r = _run_without("torch", ["run", "--plan", "plan.json", "--job", "j", "--local"], tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == ("hetsched: error: this command needs torch, which is not "
                                "installed; install it with: pip install 'hetsched[runtime]'")


@pytest.mark.slow
def test_gantt_png_without_matplotlib_names_the_plot_extra(tmp_path: Path,
                                                           examples: dict[str, Path]) -> None:
    r = _run_without("matplotlib", ["plan", str(examples["jobs"]), "--cluster",
                                    str(examples["cluster"]), "--throughputs",
                                    str(examples["throughputs"]), "--gantt", "g.png"], tmp_path)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().endswith("pip install 'hetsched[plot]'")
    assert "Traceback" not in r.stderr


def test_a_missing_plot_extra_is_found_before_any_work(tmp_path: Path,
                                                        examples: dict[str, Path]) -> None:
    """`plan --gantt` and `simulate --png` check matplotlib first: no plan, no file."""
    ins = [str(examples["jobs"]), "--cluster", str(examples["cluster"]), "--throughputs",
           str(examples["throughputs"])]
    for argv in (["plan", *ins, "-o", "plan.json", "--gantt", "g.png"],
                 ["simulate", *ins, "-o", "sim.json", "--png", "s.png"]):
        r = _run_without("matplotlib", argv, tmp_path)
        assert r.returncode == 1, r.stderr
        # one line, and nothing of the work: no candidate, no warning, no file
        assert r.stderr.strip().splitlines() == [
            "hetsched: error: this command needs matplotlib, which is not installed; "
            "install it with: pip install 'hetsched[plot]'"], r.stderr
        assert r.stdout == "" and list(tmp_path.iterdir()) == [], argv
