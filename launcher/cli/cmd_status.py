"""`jaxlaunch status`: a table of jobs, sweeps and recent local runs (launcher/job_tables.py)."""

from __future__ import annotations

import click

from .arguments import sweep_or_job_ids
from .options import user_errors



@click.command()
@click.argument("job_ids", nargs=-1, callback=sweep_or_job_ids, metavar="[JOB_ID|ARRAY_ID|SWEEP_DIR|RUN_DIR]...")
@click.option("-v", "--verbose", is_flag=True, help="For a sweep: one row per task; for a job: each rank's step time.")
@user_errors
def status(job_ids, verbose):
    """Show state, elapsed time, nodes and run directory of jobs (default: those jaxlaunch submitted,
    and the recent local runs in runs/). For a sweep (its array id or directory): the count of tasks
    in each state."""
    from .status_table import print_status

    print_status(list(job_ids), verbose, echo=click.echo)
