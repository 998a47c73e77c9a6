"""`jaxlaunch goodput`: where a job's wall time went, and each attempt's start-up budget."""

from __future__ import annotations

import importlib.util

import click

from .arguments import job_or_sweep_or_run_dir
from .options import user_errors



@click.command()
@click.argument("job_id", callback=job_or_sweep_or_run_dir, metavar="JOB_ID|RUN_DIR|SWEEP_DIR")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the timeline as a PNG here (needs matplotlib: pip install -e '.[bench]').")
@user_errors
def goodput(job_id, plot_path):
    """Where a job's wall time went, over every attempt and requeue: queued, start-up, first step,
    productive steps, checkpoint blocking, work lost, wind-down, between attempts; then each
    attempt's start-up budget: queue wait, launch, imports and MPI, jax.distributed, JAX and
    devices, preflight, restore, compile and first step. For a sweep directory: summed over its
    tasks."""
    from pathlib import Path

    from tabulate import tabulate

    from ..errors import UsageError
    from .job_lookup import find_known_job

    if plot_path and importlib.util.find_spec("matplotlib") is None:  # checked before the work, not after
        raise UsageError("--plot needs matplotlib: pip install -e '.[bench]'")
    from ..sweeps.directory import SweepDirectory

    if SweepDirectory.holds_a_sweep(job_id):
        from .goodput_view import sweep_goodput

        result, name = sweep_goodput(job_id), Path(job_id).name
    else:
        job = find_known_job(job_id, needs_run_dir=True)
        result, name = job.goodput(), job.id
    click.echo(tabulate(result.rows(), headers=["", "SECONDS", "SHARE"]))
    if result.reported:
        click.echo(f"goodput: {100 * result.goodput:.1f}% of the wall time was productive steps")
    else:  # not 0%: there were no steps to count, and the program's whole run reads as wind-down above
        click.echo("goodput: not measured: the job never reported a step, so its time after start-up counts as "
                   "wind-down above; launcher.context().report(step) in the program's loop gives goodput its steps")
    if result.governor:
        click.echo(f"not tried again: {result.governor}")
    if result.budgets:
        from .goodput_view import BUDGET_HEADERS

        click.echo("\nstart-up budget, seconds to each attempt's first report (MPI: imports, MPI_Init; "
                   "DEVICES: JAX and its devices):")
        click.echo(tabulate(result.budget_rows(), headers=["ATTEMPT", *BUDGET_HEADERS, "TOTAL"],
                            disable_numparse=True, stralign="right"))
    if plot_path:
        from .goodput_view import plot

        plot(result, Path(plot_path), title=f"{name}: goodput {100 * result.goodput:.0f}%")
        click.echo(f"timeline: {plot_path}")
