"""``hetsched config show``: every setting, its effective value and where it came from."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from hetsched import config
from hetsched.cli.options import format_option


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
    tab = Table(title="hetsched settings")
    for col in ("setting", "value", "from", "variable"):
        tab.add_column(col, overflow="fold")
    for r in rows:
        tab.add_row(r["key"], str(r["value"]) if r["value"] != "" else "-", r["origin"], r["env"])
    Console(soft_wrap=True).print(tab)
    click.echo(f"site config: {config.site_config_path()}\nuser config: "
               f"{config.user_config_path()}")
