"""`jaxlaunch run`: a spec (or a script, or a module) in the foreground: on this machine, or as a
job of --backend NAME followed to its end (cli/start_job.py, the path `submit` shares)."""

from __future__ import annotations

import sys

import click

from ..backends import RUN_DEFAULT
from . import start_job
from .arguments import BackendName
from .options import ProgramCommand, job_or_sweep, progress, spec_options, sweep_options, user_errors


@click.command(cls=ProgramCommand)
@spec_options(required=False)
@sweep_options
@click.option("--run-dir", type=click.Path(file_okay=False),
              help="Run directory (default: runs/NAME-TIME); for a sweep, the sweep directory.")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue a preempted, failed or cancelled run in its own run directory (with its spec).")
@click.option("--backend", "backend_name", type=BackendName(), default=RUN_DEFAULT, show_default=True,
              help="Where: this machine (local), or a backend of the registry, whose job is followed to its end "
                   "(Ctrl-C cancels it).")
@user_errors
def run(spec, overrides, program_args, sweeps, max_parallel, run_dir, dry_run, resume_dir, backend_name):
    """Run SPEC in the foreground: nodes x processes_per_node processes under mpirun on this machine,
    or (--backend) as a job followed to its end, with its exit code. With a sweep, every
    configuration, --max-parallel at a time. SPEC may be a script (`jaxlaunch run train.py -n 2 --
    --lr 0.1`): it runs with every other key at its default."""
    from ..backends import get_backend

    backend = get_backend(backend_name)
    if resume_dir is not None:
        if spec is not None or overrides or program_args or sweeps or run_dir is not None or dry_run:
            raise click.UsageError("--resume RUN_DIR runs the spec saved in RUN_DIR: give no SPEC, --set, "
                                   "--sweep, --run-dir or --dry-run with it")
        # Backend.resume: the run continues where it ran, in its own folder with its own spec
        sys.exit(backend.resume(resume_dir, echo=progress, print_result=click.echo).exit_code())
    job = job_or_sweep(spec, overrides, sweeps, max_parallel, program_args)
    start_job.start(backend, job, run_dir, max_parallel, dry_run=dry_run, foreground=True)
