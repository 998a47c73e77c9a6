"""`jaxlaunch watch`: a live view of one job until it ends (launcher/watch.py draws it)."""

from __future__ import annotations

import sys

import click

from .arguments import job_id_or_run_dir
from .options import user_errors



@click.command()
@click.argument("job_id", callback=job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between redraws.")
@user_errors
def watch(job_id, interval):
    """A live view of a job until it ends: state, progress bar, rate and ETA, the latest metrics with
    their history, each rank's step time and the slow rank. Exits with the job's exit code."""
    from .job_lookup import find_known_job
    from .watch_view import watch as live_view

    job = find_known_job(job_id)
    try:
        live_view(job, interval)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(job.exit_code())
