"""``hetsched profiles list|export|import|forget|refine``: the profile history in the state file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hetsched.cli.options import format_option, state_option


@click.group("profiles")
def profiles() -> None:
    """See, export, import, forget and refine the profile history in the state store."""


@profiles.command("list")
@state_option
@format_option("table", "json")
def profiles_list(state_path: str | None, fmt: str) -> None:
    """One line per (workload, GPU type): fit a + c*b, batches, status, source."""
    from hetsched.state.history import listing
    from hetsched.state.store import open_store

    with open_store(state_path) as st:
        rows = listing(st)
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no profiles (run `hetsched profile JOBS.yaml`)")
        return
    click.echo(f"{'workload':<16} {'gpu':<8} {'status':<9} {'a (s)':>9} {'c (s/sample)':>13} "
               f"{'max b':>6} {'samples/s':>10}  batches / source")
    for r in rows:
        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)
        click.echo(f"{r['workload']:<16} {r['gpu_type']:<8} {r['status']:<9} "
                   f"{f(r['a_s'], '.4g'):>9} {f(r['c_s'], '.4g'):>13} "
                   f"{f(r['max_batch'], 'd'):>6} {f(r['peak_samples_per_s'], '.1f'):>10}  "
                   f"{','.join(map(str, r['batches'])) or '-'} / "
                   f"{','.join(r['sources']) or r['reason']}")


@profiles.command("export")
@state_option
@click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
              help="CSV file (default stdout).")
@click.option("--workload", default=None)
@click.option("--gpu-type", default=None)
def profiles_export(state_path: str | None, out: str | None, workload: str | None,
                    gpu_type: str | None) -> None:
    """Write the usable history as a throughput CSV (the planner's --throughputs format)."""
    from hetsched.state.history import export_csv
    from hetsched.state.store import open_store

    with open_store(state_path) as st:
        text = export_csv(st, workload, gpu_type.lower() if gpu_type else None)
    if out:
        from hetsched.io.files import write_user_file

        write_user_file(out, text)
    else:
        click.echo(text, nl=False)


@profiles.command("import")
@click.argument("csv_file", type=click.Path())
@state_option
def profiles_import(csv_file: str, state_path: str | None) -> None:
    """Add a throughput CSV's rows of one GPU's step to the history (e.g. measurements
    from elsewhere). Rows of several GPUs or of co-located pairs are left out and counted:
    the history keeps one GPU's step per batch; plan with --throughputs CSV to use them."""
    from hetsched.io.profiles import load_throughputs
    from hetsched.state.history import import_rows
    from hetsched.state.store import open_store

    rows = load_throughputs(csv_file).all_rows()
    with open_store(state_path) as st:
        n = import_rows(st, rows, f"import:{Path(csv_file).name}")
    pairs = sum(1 for r in rows if r.colocated_with is not None)
    left = [f"{k} {what}" for k, what in ((len(rows) - n - pairs, "of several GPUs"),
                                          (pairs, "of co-located pairs")) if k]
    click.echo(f"imported {n} rows" + (f"; left out {' and '.join(left)} (the history keeps "
                                       f"one GPU's step; plan with --throughputs "
                                       f"{Path(csv_file).name} to use them)" if left else ""))


@profiles.command("forget")
@state_option
@click.option("--workload", default=None)
@click.option("--gpu-type", default=None)
@click.option("--all", "everything", is_flag=True, help="Forget the whole history.")
def profiles_forget(state_path: str | None, workload: str | None, gpu_type: str | None,
                    everything: bool) -> None:
    """Delete history (and unusable marks) so the next `profile` probes again."""
    from hetsched.state.history import forget, forget_all
    from hetsched.state.store import open_store

    with open_store(state_path) as st:
        n = forget_all(st) if everything else forget(st, workload, gpu_type)
    click.echo(f"forgot {n} rows")


@profiles.command("refine")
@click.argument("reports", nargs=-1, type=click.Path())
@state_option
@click.option("--alpha", type=float, default=0.3, show_default=True,
              help="EWMA weight of a new measurement.")
def profiles_refine(reports: tuple[str, ...], state_path: str | None, alpha: float) -> None:
    """Fold running jobs' reports (default: every job report under STATE.files/reports) into the
    history with an exponentially weighted moving average; each line is counted once."""
    from hetsched.app.submit import files_dir
    from hetsched.io.jobfiles import all_reports
    from hetsched.state.history import ingest_reports
    from hetsched.state.store import open_store

    with open_store(state_path) as st:
        paths = list(reports) or [str(p) for p in all_reports(files_dir(st))]
        changes = ingest_reports(st, paths, alpha)
    for w, g, b, old, new in changes[-20:]:
        click.echo(f"{w} {g} b={b}: {'-' if old is None else f'{old:.4g}'} -> {new:.4g} s")
    click.echo(f"{len(changes)} measurements from {len(paths)} reports", err=True)


