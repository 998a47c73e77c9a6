"""`jaxlaunch results`: every task's result of a sweep in one table, with plots and the best."""

from __future__ import annotations

import importlib.util

import click

from .options import user_errors



@click.command()
@click.argument("sweep_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--plot", "plot_metric", metavar="METRIC", help="Write METRIC_vs_KEY.png: METRIC against a swept key.")
@click.option("--x", "x_key", metavar="KEY", help="With --plot: the swept key on the x axis (default: the first).")
@click.option("--by", "by_key", metavar="KEY", help="With --plot: one line per value of this swept key "
                                                    "(default: the next one).")
@click.option("--curve", "curve_metric", metavar="METRIC",
              help="Write METRIC_curves.png: METRIC against the step, one line per configuration (ctx.report).")
@click.option("--best", "best_metric", metavar="METRIC", help="Name the configuration with the best METRIC.")
@click.option("--max", "maximize", is_flag=True, help="With --best: larger is better (default: smaller).")
@click.option("--min", "minimize", is_flag=True, help="With --best: smaller is better (the default).")
@user_errors
def results(sweep_dir, plot_metric, x_key, by_key, curve_metric, best_metric, maximize, minimize):
    """Collect every task's result of a sweep into one table (also written as results.csv and
    results.json in SWEEP_DIR). Works while the sweep is still running."""
    from pathlib import Path

    from ..sweeps.metrics import best, plot
    from ..sweeps.table import collect, format_table, write_csv, write_json

    if maximize and minimize:
        raise click.UsageError("give --max or --min, not both")
    if (x_key or by_key) and not plot_metric:
        raise click.UsageError("--x and --by go with --plot METRIC")
    if (plot_metric or curve_metric) and importlib.util.find_spec("matplotlib") is None:
        raise click.UsageError("--plot and --curve need matplotlib: pip install -e '.[bench]'")
    table = collect(sweep_dir)
    click.echo(format_table(table))
    from ..sweeps.directory import SweepDirectory

    folder, directory = Path(sweep_dir), SweepDirectory(sweep_dir)
    write_csv(table, directory.results_csv)
    write_json(table, directory.results_json)
    # the paths as the user named the sweep (SweepDirectory's are absolute)
    click.echo(f"wrote {folder / directory.results_csv.name} and {folder / directory.results_json.name}", err=True)
    if plot_metric:
        path = plot(table, plot_metric, folder / f"{plot_metric}.png", x=x_key, by=by_key)
        click.echo(f"wrote {path}", err=True)
    if curve_metric:
        from ..sweeps.metrics import plot_curves

        path = plot_curves(sweep_dir, curve_metric, folder / f"{curve_metric}_curves.png")
        click.echo(f"wrote {path}", err=True)
    if best_metric:
        row = best(table, best_metric, minimize=not maximize)
        sweep_keys = table.columns[1:table.columns.index("state")]
        values = ", ".join(f"{k}={row.get(k)!r}" for k in sweep_keys)
        click.echo(f"best {best_metric} ({'max' if maximize else 'min'}): {row.get(best_metric)!r} "
                   f"from task {row.get('task')} ({values})")
