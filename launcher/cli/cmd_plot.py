"""`jaxlaunch plot`: a PNG of one metric a job reported."""

from __future__ import annotations

import importlib.util

import click

from .arguments import job_id_or_run_dir
from .options import user_errors



@click.command()
@click.argument("job_id", callback=job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.argument("metric")
@click.option("--x", "x_axis", type=click.Choice(["step", "time"]), default="step", show_default=True,
              help="Against the step, or the seconds since the first report.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the PNG (default: RUN_DIR/METRIC.png).")
@user_errors
def plot(job_id, metric, x_axis, out_path):
    """A PNG of a metric the job reported with ctx.report (needs matplotlib: pip install -e '.[bench]')."""
    from pathlib import Path

    from ..errors import UsageError
    from .job_lookup import find_known_job
    from ..rundir.metrics import plot_metric

    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("jaxlaunch plot needs matplotlib: pip install -e '.[bench]'")
    job = find_known_job(job_id, needs_run_dir=True)
    path = Path(out_path) if out_path else job.run_dir / f"{metric}.png"
    try:
        points = plot_metric(job.run_dir, metric, path, x_axis)
    except ValueError as exc:
        names = sorted({k for r in job.metrics() for k in r if k not in ("step", "time")})
        raise UsageError(f"{exc}; its metrics: {', '.join(names) or 'none (the job never called ctx.report)'}") \
            from exc
    click.echo(f"{path} ({points} points)")
