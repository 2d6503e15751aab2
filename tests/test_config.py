"""Settings: CLI > environment > user config > site config > default, shown by `config show`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest


def _show(tmp_path: Path, **env: str) -> tuple[int, dict, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETSCHED_")}
    base.update(XDG_CONFIG_HOME=str(tmp_path / "user"),
                HETSCHED_SITE_CONFIG=str(tmp_path / "site.toml"), **env)
    r = subprocess.run(["hetsched", "config", "show", "--format", "json"], env=base,
                       capture_output=True, text=True, timeout=60)
    rows = {x["key"]: x for x in json.loads(r.stdout)} if r.returncode == 0 else {}
    return r.returncode, rows, r.stderr


def test_precedence_env_user_site_default(tmp_path: Path) -> None:
    (tmp_path / "user" / "hetsched").mkdir(parents=True)
    (tmp_path / "site.toml").write_text('partition = "site-gpu"\nrestart_cost_s = 30\n'
                                        'state = "/site/state.db"\n')
    (tmp_path / "user" / "hetsched" / "config.toml").write_text('partition = "user-gpu"\n')
    code, rows, err = _show(tmp_path, HETSCHED_STATE="/env/state.db")
    assert code == 0, err
    assert (rows["state"]["value"], rows["state"]["origin"]) == (
        "/env/state.db", "environment $HETSCHED_STATE")
    assert rows["partition"]["value"] == "user-gpu"
    assert rows["partition"]["origin"].startswith("user config")
    assert rows["restart_cost_s"]["value"] == 30.0
    assert rows["restart_cost_s"]["origin"].startswith("site config")
    assert (rows["templates"]["value"], rows["templates"]["origin"]) == ("", "default")


@pytest.mark.slow
def test_bad_config_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "site.toml").write_text('partiton = "x"\n')
    code, _, err = _show(tmp_path)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert f"{tmp_path / 'site.toml'}: unknown setting 'partiton'; valid: state, " in line
    (tmp_path / "site.toml").write_text('restart_cost_s = "soon"\n')
    code, _, err = _show(tmp_path)
    assert code == 2 and "restart_cost_s: 'soon' is not a number" in err


def test_one_sbatch_setting_per_slurm_key(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key of a jobs file's `slurm:` has its `sbatch_KEY` setting, and no more."""
    from hetsched import config
    from hetsched.core.sbatch import KEYS

    for k in [k for k in os.environ if k.startswith("HETSCHED_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user"))
    monkeypatch.setenv("HETSCHED_SITE_CONFIG", str(tmp_path / "site.toml"))

    assert {k.removeprefix("sbatch_") for k in config.SETTINGS if k.startswith("sbatch_")} \
        == set(KEYS)
    monkeypatch.setenv("HETSCHED_SBATCH_QOS", "high")
    monkeypatch.setenv("HETSCHED_SBATCH_EXTRA", "--exclusive --mail-type=END")
    assert config.sbatch_defaults() == {"qos": "high",
                                        "extra": ["--exclusive", "--mail-type=END"]}


@pytest.mark.parametrize("raw, want", [("1", True), ("true", True), ("Yes", True),
                                       ("on", True), ("0", False), ("false", False),
                                       ("no", False), ("OFF", False)])
def test_a_yes_no_setting_reads_words(raw: str, want: bool) -> None:
    """`HETSCHED_REPLAN_ONLINE=true` was refused as "not a number" (a TOML `true` was
    taken): a yes/no setting reads the words people write, from either place."""
    from hetsched import config

    assert config.resolve("replan_online", {"HETSCHED_REPLAN_ONLINE": raw}) == (
        want, "environment $HETSCHED_REPLAN_ONLINE")


def test_setting_kinds_refuse_and_show(tmp_path: Path) -> None:
    (tmp_path / "user" / "hetsched").mkdir(parents=True)
    (tmp_path / "user" / "hetsched" / "config.toml").write_text(
        "replan_online = true\nreport_every = 5.0\n")
    code, rows, err = _show(tmp_path, HETSCHED_PLAN_WORKERS="2")
    assert code == 0, err
    assert rows["replan_online"]["value"] is True
    assert rows["report_every"]["value"] == 5 and isinstance(rows["report_every"]["value"],
                                                             int)
    assert rows["plan_workers"]["value"] == 2
    for var, raw, want in [
            ("HETSCHED_REPLAN_ONLINE", "maybe", "replan_online: 'maybe' is not valid; "
             "expected true or false (or 1/0, yes/no, on/off)"),
            ("HETSCHED_REPORT_EVERY", "2.5", "report_every: '2.5' is not valid; expected a "
             "whole number >= 0"),
            ("HETSCHED_PLAN_WORKERS", "-1", "plan_workers: '-1' is not valid; expected a "
             "whole number >= 0")]:
        code, _, err = _show(tmp_path, **{var: raw})
        assert (code, err.strip()) == (2, f"hetsched: error: ${var}: {want}")
    base = {k: v for k, v in os.environ.items() if not k.startswith("HETSCHED_")}
    base.update(XDG_CONFIG_HOME=str(tmp_path / "user"),
                HETSCHED_SITE_CONFIG=str(tmp_path / "site.toml"))
    table = subprocess.run(["hetsched", "config", "show"], env=base, capture_output=True,
                           text=True, timeout=60).stdout
    [online] = [line for line in table.splitlines() if "replan_online" in line]
    [every] = [line for line in table.splitlines() if "report_every" in line]
    assert " true " in online and " 5 " in every and "5.0" not in every


def test_config_show_names_the_default_state_file(tmp_path: Path) -> None:
    """`config show` printed '-' for the state file every command uses by default."""
    code, rows, err = _show(tmp_path, XDG_STATE_HOME=str(tmp_path / "xdg"))
    assert code == 0, err
    assert (rows["state"]["value"], rows["state"]["origin"]) == (
        str(tmp_path / "xdg" / "hetsched" / "state.db"), "default")
