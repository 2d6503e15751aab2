"""Options every command spells the same way (docs/cli.md is the convention).

- Machine-readable output is ``--format table|json[|yaml]``; ``--json`` is an
  alias of ``--format json`` wherever ``--format`` has json.
- Slurm's own short flags mean what they mean in Slurm: ``-p`` the partition,
  ``-t`` the time limit, ``-A`` the account, ``-q`` the QoS, ``-C`` constraints.
- Paths are ``click.Path`` (shell completion completes files); options that have a
  ``HETSCHED_*`` setting name it with ``envvar=`` and show it in ``--help``.
  Precedence stays CLI > environment > user config > site config > default: an
  option left unset is ``None`` and :mod:`hetsched.config` resolves the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

STATE_HELP = ("State file (SQLite). Default: the `state` setting "
              "(hetsched config show), else ~/.local/state/hetsched/state.db")


def _path() -> click.Path:
    """A path for completion only: the command checks it and answers in one line (click's own
    check of a directory or a missing file is a three-line usage error)."""
    return click.Path()


def state_option(f: F) -> F:
    return click.option("--state", "state_path", type=_path(), default=None,
                        envvar="HETSCHED_STATE", show_envvar=True, help=STATE_HELP)(f)


def partition_option(help: str = "Slurm partition (default: the `partition` setting).",
                     ) -> Callable[[F], F]:
    return click.option("--partition", "-p", default=None, envvar="HETSCHED_PARTITION",
                        show_envvar=True, help=help)


def format_option(*choices: str, default: str = "table") -> Callable[[F], F]:
    """``--format CHOICE`` plus ``--json`` as its alias; the command receives ``fmt``."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.pop("as_json_alias", False):
                kwargs["fmt"] = "json"
            return f(*args, **kwargs)

        wrapped = click.option("--json", "as_json_alias", is_flag=True,
                               help="Same as --format json.")(wrapper)
        wrapped = click.option("--format", "fmt", type=click.Choice(list(choices)),
                               default=default, show_default=True,
                               help="Output format on stdout (only the document).")(wrapped)
        return wrapped  # type: ignore[return-value]

    return deco


def needs_extra(module: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """An option callback: when the option is given, import MODULE now, before any work.

    A missing optional dependency then fails while the command line is
    parsed (the main group turns the ModuleNotFoundError into one line
    naming the extra), not after a plan was computed and files written.
    """

    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value:
            import importlib

            importlib.import_module(module)
        return value

    return check


def exit_codes_help() -> str:
    """The exit code table (hetsched.errors.EXIT_CODES) as the epilog of ``hetsched --help``.

    The wheel installs no documents, so ``--help`` carries what a user needs.
    """
    from hetsched.errors import EXIT_CODES

    return "\b\nExit codes:\n" + "\n".join(f"  {code:>3}  {what}"
                                         for code, what in EXIT_CODES.items())
