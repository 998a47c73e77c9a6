"""`jaxlaunch logs` and `jaxlaunch cancel`: a job's output, and stopping it."""

from __future__ import annotations

import click

from .arguments import job_id_or_run_dir
from .options import user_errors



@click.command()
@click.argument("job_id", callback=job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@click.option("--rank", type=int, help="Show this rank's full log instead of the job's combined output.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@user_errors
def logs(job_id, rank, follow):
    """Print a job's output: a Slurm job's, or a run directory's."""
    from ..backends.records import NoLogYet
    from .job_lookup import find_known_job

    job = find_known_job(job_id, needs_run_dir=True)
    path = None if follow else job.log_path(rank)
    if path is not None and not path.exists():
        raise NoLogYet(job.id, rank, path)
    if follow:
        job.follow_logs(rank, write=lambda text: click.echo(text, nl=False))
    else:
        click.echo(job.logs(rank), nl=False)
    for line in job.failure_lines():  # after the log, on stderr: the log stays clean
        click.echo(line, err=True)


@click.command()
@click.argument("job_id", callback=job_id_or_run_dir, metavar="JOB_ID|RUN_DIR")
@user_errors
def cancel(job_id):
    """Cancel a job, a whole job array (its id), one array task (ID_N), or a local run (RUN_DIR)."""
    from ..backends import find_job

    job = find_job(job_id, to_cancel=True)
    job.cancel()
    click.echo(f"cancelled job {job_id}")
