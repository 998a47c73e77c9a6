"""`jaxlaunch run`: a spec (or a script, or a module) on this machine, in the foreground."""

from __future__ import annotations

import sys

import click

from .options import ProgramCommand, is_sweep, job_or_sweep, print_results_table, progress, spec_options, sweep_options, user_errors



@click.command(cls=ProgramCommand)
@spec_options(required=False)
@sweep_options
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Run directory (default: runs/NAME-TIME); for a sweep, the sweep directory.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue a preempted, failed or cancelled run in its own run directory (with its spec).")
@user_errors
def run(spec, overrides, program_args, sweeps, max_parallel, run_dir, dry_run, resume_dir):
    """Run SPEC on this machine: nodes x processes_per_node processes under mpirun.
    With a sweep, every configuration, --max-parallel at a time. SPEC may be a script
    (`jaxlaunch run train.py -n 2 -- --lr 0.1`): it runs with every other key at its default."""
    from ..backends import RUN_DEFAULT, get_backend

    local = get_backend(RUN_DEFAULT)
    if resume_dir is not None:
        if spec is not None or overrides or program_args or sweeps or run_dir is not None or dry_run:
            raise click.UsageError("--resume RUN_DIR runs the spec saved in RUN_DIR: give no SPEC, --set, "
                                   "--sweep, --run-dir or --dry-run with it")
        # Backend.resume: the run continues where `run` runs, in its own folder with its own spec
        sys.exit(local.resume(resume_dir, echo=progress, print_result=click.echo).exit_code())
    job = job_or_sweep(spec, overrides, sweeps, max_parallel, program_args)
    if dry_run:
        click.echo(local.plan(job, run_dir).describe(), nl=False, color=True)
    elif is_sweep(job):
        directory, code = local.start_sweep(job, run_dir, max_parallel, echo=progress)
        print_results_table(directory.path)
        sys.exit(code)
    else:
        sys.exit(local.run_here(job, run_dir, echo=progress, print_result=click.echo).exit_code())
