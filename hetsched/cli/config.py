"""``hetsched config show``: every setting, its effective value and where it came from."""

from __future__ import annotations

import json

import click

from hetsched import config
from hetsched.cli.options import format_option
from hetsched.cli.tables import folding_table, print_table, stdout_console


@click.group("config")
def config_cmd() -> None:
    """Site and user settings (/etc/hetsched/config.toml, ~/.config/hetsched/config.toml).

    Precedence, highest first: command-line option, environment (HETSCHED_*),
    user config, site config, default.
    """


@config_cmd.command("show")
@format_option("table", "json")
def show_cmd(fmt: str) -> None:
    """Print each setting's effective value and its origin."""
    rows = config.show()
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    con = stdout_console()
    tab = folding_table("hetsched settings", [
        ("setting", "left", "name"), ("value", "left", "list"), ("from", "left", "list"),
        ("variable", "left", "name")],
        [(r["key"], _shown(r["value"]), r["origin"], r["env"])
         for r in rows], con.width)
    print_table(con, tab)
    click.echo(f"site config: {config.site_config_path()}\nuser config: "
               f"{config.user_config_path()}")


def _shown(value: object) -> str:
    """A value as a config file writes it: true/false, 10 (not 10.0), '-' for unset."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if value != "" else "-"
