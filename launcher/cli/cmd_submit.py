"""`jaxlaunch submit`: a spec to a scheduler (a sweep as job arrays), optionally followed to its end."""

from __future__ import annotations

import sys

import click

from ..backends import SUBMIT_DEFAULT
from .arguments import BackendName
from .options import ProgramCommand, is_sweep, job_or_sweep, print_results_table, progress, spec_options, sweep_options, user_errors
from ..states import JobState



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
    if is_sweep(job) and not dry_run:
        _submit_sweep(backend, job, max_parallel, run_dir, wait, parsable, no_check)
        return
    plan = backend.plan(job, run_dir, max_parallel)  # what --dry-run shows is what is started
    if dry_run:
        click.echo(plan.describe(), nl=False, color=True)
    else:
        handle = backend.start_plan(plan, check=not no_check)
        for warning in handle.warnings:
            progress(f"warning: {warning}")
        # With --wait, stdout is for the result, as with `run`; the job id goes to stderr with the progress.
        click.echo(handle.id if parsable else f"Submitted job {handle.id}; run directory: {handle.run_dir}", err=wait)
        if wait:
            from .job_lookup import wait_for
            from ..supervisor import result_text

            if wait_for(handle, progress) == JobState.COMPLETED and result_text(handle.run) is not None:
                click.echo(result_text(handle.run))
            sys.exit(handle.exit_code())


def _submit_sweep(backend, sweep, max_parallel, run_dir, wait, parsable, no_check):
    directory, ids = backend.start_sweep(sweep, run_dir, max_parallel, echo=progress, check=not no_check)
    if parsable:
        click.echo(",".join(ids), err=wait)
    else:
        click.echo(f"Submitted sweep of {len(sweep.configurations)} configurations as job array"
                   f"{'s' if len(ids) > 1 else ''} {', '.join(ids)}; sweep directory: {directory.path}", err=wait)
    if wait:
        states = backend.wait_for_sweep(directory, echo=progress)
        print_results_table(directory.path)
        sys.exit(0 if all(t.state == JobState.COMPLETED for t in states) else 1)
