"""`jaxlaunch submit`: a spec to a scheduler (a sweep as job arrays), optionally followed to its end
(cli/start_job.py, the path `run` shares)."""

from __future__ import annotations

import click

from ..backends import SUBMIT_DEFAULT
from . import start_job
from .arguments import BackendName
from .options import ProgramCommand, job_or_sweep, spec_options, sweep_options, user_errors


@click.command(cls=ProgramCommand)
@spec_options
@sweep_options
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Run directory (default: runs/NAME-TIME); for a sweep, the sweep directory.")
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job (or every task of a sweep) until it ends; exit 0 only "
                                           "if all COMPLETED.")
@click.option("--parsable", is_flag=True, help="Print only the job id (for a sweep, the array ids).")
@click.option("--no-check", is_flag=True, help="Do not check the request against the cluster before sbatch.")
@click.option("--backend", "backend_name", type=BackendName(), default=SUBMIT_DEFAULT, show_default=True,
              help="The scheduler to submit to: a backend of the registry (entry points jaxlaunch.backends).")
@user_errors
def submit(spec, overrides, program_args, sweeps, max_parallel, run_dir, dry_run, wait, parsable, no_check,
           backend_name):
    """Submit SPEC to Slurm with sbatch (or to --backend NAME); a sweep as one job array."""
    from ..backends import get_backend

    backend, job = get_backend(backend_name), job_or_sweep(spec, overrides, sweeps, max_parallel, program_args)
    start_job.start(backend, job, run_dir, max_parallel, dry_run=dry_run, foreground=False, wait=wait,
                    parsable=parsable, check=not no_check)
