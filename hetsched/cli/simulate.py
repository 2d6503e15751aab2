"""`hetsched simulate TRACE`: replay a job trace online and compare with the offline plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hetsched.cli.options import format_option, needs_extra


@click.command("simulate")
@click.argument("trace", metavar="TRACE", type=click.Path())
@click.option("--cluster", "cluster_file", metavar="CLUSTER.yaml", required=True,
              type=click.Path(),
              help="Cluster YAML to replay the trace on.")
@click.option("--throughputs", "tp_file", metavar="PROFILES.csv", type=click.Path(),
              help="Throughput CSV (the true step times). Default: the profile history.")
@click.option("--policy", default="opd", show_default=True,
              help="Policy run online (any of `hetsched policies` but auto).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Policy parameter, repeatable.")
@click.option("--noise", type=click.FloatRange(min=0, max=0.99), default=0.0, show_default=True,
              help="The policy sees each job's iteration times (compute and sync) off by up "
                   "to this fraction (0.2 = +-20%, per job); the replay runs the true ones.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise.")
@click.option("--restart-cost", type=click.FloatRange(min=0), default=None,
              help="Seconds a running job loses when its GPUs change (default: the "
                   "restart_cost_s setting, 60).")
@click.option("--offline", default="auto", show_default=True,
              help="Policy of the offline reference plan (all profiles true); 'none' skips it.")
@click.option("--out", "-o", "json_out", type=click.Path(dir_okay=False),
              help="Write the results (metrics, ratios, per-job rows) as JSON here.")
@format_option("table", "json")
@click.option("--png", "png_out", type=click.Path(dir_okay=False),
              callback=needs_extra("matplotlib"),
              help="Write a JCT CDF (online vs offline) here; a Gantt chart goes beside it "
                   "(NAME-gantt.png).")
def simulate_cmd(trace: str, cluster_file: str, tp_file: str | None, policy: str,
                 params: tuple[str, ...], noise: float, seed: int, restart_cost: float | None,
                 offline: str, json_out: str | None, png_out: str | None, fmt: str) -> None:
    """Replay TRACE's jobs in arrival order with POLICY deciding online.

    TRACE is a jobs YAML with arrival_s (`hetsched convert gavel-trace` makes
    one) or a Gavel .trace file. The policy sees a job only once it has arrived and is asked again at
    every arrival and completion (receding horizon). Prints weighted and
    average JCT, makespan, queueing delay, GPU utilisation, restarts per job,
    and the ratios to the offline plan and to the lower bound (the empirical
    competitive ratio is at most the latter).
    """
    from hetsched.app.plan import load_inputs, parse_params, plan_settings
    from hetsched.app.simulate import simulate_trace
    from hetsched.cli.main import write_output
    from hetsched.cli.progress import RichReporter
    from hetsched.cli.tables import stdout_console

    settings = plan_settings(policy=policy, params=parse_params(params),
                             restart_cost_s=restart_cost)
    inputs = load_inputs(trace, settings, cluster_file=cluster_file, partition=None,
                         tp_file=tp_file, history=False)
    jobs, cluster, table = inputs.jobs, inputs.cluster, inputs.table
    with RichReporter() as rep:
        res = simulate_trace(
            jobs, cluster, table, policy, dict(settings.params), jobs_source=trace,
            noise=noise, seed=seed, restart_cost_s=settings.restart_cost_s,
            offline=None if offline == "none" else offline, reporter=rep)
    body = res.to_dict()
    if json_out:
        write_output(json_out, json.dumps(body, indent=2) + "\n")
    if png_out:
        _pngs(res, png_out)
    if fmt == "json":
        click.echo(json.dumps(body, indent=2))
        return
    con = stdout_console()
    m = res.metrics
    con.print(f"policy {policy} online, noise {noise:.0%}, {len(jobs)} jobs")
    con.print(f"  weighted JCT   {m['weighted_jct_s']:>14,.1f} s")
    con.print(f"  average JCT    {m['avg_jct_s']:>14,.1f} s")
    con.print(f"  makespan       {m['makespan_s']:>14,.1f} s")
    con.print(f"  queueing delay {m['avg_queue_s']:>14,.1f} s (mean)")
    con.print(f"  GPU utilisation {m['gpu_utilisation']:>12.1%}")
    con.print(f"  restarts/job   {m['restarts_per_job']:>14.2f}")
    if res.offline is not None:
        con.print(f"  offline ({res.offline.policy}) {res.offline.weighted_jct_s:,.1f} s; "
                  f"online/offline {res.ratio_offline:.3f}")
    con.print(f"  lower bound {res.lower_bound_s:,.1f} s; online/bound {res.ratio_lower_bound:.3f}"
              " (>= the empirical competitive ratio)")
    if "opd" in body:
        o = body["opd"]
        proved = "" if o.get("bound_proved") else ", not proved for this variant"
        con.print(f"  opd: alpha {o['alpha']} (paper's bound 4*alpha = {o['competitive_bound']}"
                  f"{proved})")


def _pngs(res: object, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetsched.app.simulate import SimResult
    from hetsched.cli.pictures import png_gantt

    assert isinstance(res, SimResult)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, plan in (("online " + res.policy, res.online), ("offline", res.offline)):
        if plan is None:
            continue
        xs = sorted(j.jct_s / 3600 for j in plan.jobs)
        ax.step(xs, [(k + 1) / len(xs) for k in range(len(xs))], where="post", label=label)
    ax.set_xlabel("JCT (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    from hetsched.cli.pictures import save_png

    save_png(fig, path)
    p = Path(path)
    png_gantt(res.online, p.with_name(p.stem + "-gantt" + p.suffix))
