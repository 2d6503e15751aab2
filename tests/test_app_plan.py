"""app/plan.py: `plan`, `submit jobs.yaml`, `replan` and `simulate` plan from one settings
object, and every planning setting of the config reaches the plan."""

from __future__ import annotations

import json

from click.testing import CliRunner

from hetsched.app.plan import how_planned, plan_settings
from hetsched.cli.main import main
from hetsched.cli.slurm import load_plan_input
from hetsched.config import DEFAULT_RESTART_COST_S


def _plan(examples, *extra: str, env: dict[str, str] | None = None) -> dict:
    res = CliRunner().invoke(main, ["plan", str(examples["jobs"]), "--cluster",
                                    str(examples["cluster"]), "--throughputs",
                                    str(examples["throughputs"]), "--policy", "fifo",
                                    "--format", "json", *extra], env=env)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_restart_cost_setting_reaches_the_plan(examples, tmp_path, monkeypatch) -> None:
    """$HETSCHED_RESTART_COST is what `config show` says it is: the plan's restart cost."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no user or site config file
    monkeypatch.setenv("HETSCHED_SITE_CONFIG", str(tmp_path / "none.toml"))
    d = _plan(examples, env={"HETSCHED_RESTART_COST": "5"})
    assert d["settings"]["restart_cost_s"] == 5.0
    assert d["restart_cost_s"] == 5.0
    # the option beats the environment; neither: the one default
    assert _plan(examples, "--restart-cost", "7",
                 env={"HETSCHED_RESTART_COST": "5"})["settings"]["restart_cost_s"] == 7.0
    assert _plan(examples, env={"HETSCHED_RESTART_COST": ""})["settings"]["restart_cost_s"] \
        == DEFAULT_RESTART_COST_S


def test_submit_jobs_yaml_plans_as_plan_does(examples, monkeypatch) -> None:
    """`submit jobs.yaml` keeps the mode, parameters and restart cost it was given."""
    monkeypatch.setenv("HETSCHED_RESTART_COST", "9")
    settings = plan_settings(policy="jps", params={"samples": 5}, static=True)
    plan = load_plan_input(str(examples["jobs"]), settings,
                           throughputs=str(examples["throughputs"]),
                           cluster_file=str(examples["cluster"]), partition=None)
    assert plan.settings == settings
    assert plan.settings is not None and plan.settings.restart_cost_s == 9.0
    assert plan.settings.static and dict(plan.settings.params) == {"samples": 5}


def test_replan_of_a_plan_without_settings_uses_the_config(monkeypatch) -> None:
    monkeypatch.setenv("HETSCHED_RESTART_COST", "3")
    s = how_planned(None, None)
    assert (s.mode, s.policy, s.restart_cost_s) == ("space", "auto", 3.0)


def test_plan_budget_setting_reaches_auto(examples, tmp_path, monkeypatch) -> None:
    """$HETSCHED_PLAN_BUDGET bounds `auto`: with no time at all, the first candidate runs
    and every other is skipped for the budget (the plan says so)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("HETSCHED_SITE_CONFIG", str(tmp_path / "none.toml"))
    res = CliRunner().invoke(main, ["plan", str(examples["jobs"]), "--cluster",
                                    str(examples["cluster"]), "--throughputs",
                                    str(examples["throughputs"]), "--format", "json"],
                             env={"HETSCHED_PLAN_BUDGET": "0"})
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert len(d["candidates"]) == 1
    assert d["skipped"] and all("plan_budget_s" in why for why in d["skipped"].values())
