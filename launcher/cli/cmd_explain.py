"""`jaxlaunch explain` (where each rank runs and what it sees, and whether the request fits) and
`jaxlaunch render` (the batch script or mpirun command, byte for byte what would run)."""

from __future__ import annotations

import sys

import click

from ..backends import RUN_DEFAULT, SUBMIT_DEFAULT
from .arguments import BackendName
from .options import spec_options, user_errors



@click.command()
@spec_options
@click.option("--target", type=BackendName(), default=RUN_DEFAULT, show_default=True,
              help="Ranks as `jaxlaunch run` starts them here (local), or as a backend's job: slurm (checked "
                   "against the cluster), or another backend's name.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory to show paths for.")
@user_errors
def explain(spec, overrides, program_args, target, run_dir):
    """Show each rank's node, local rank, devices, environment and mesh, the resources requested,
    and (--target slurm) whether the request fits the cluster; exit 2 if it cannot."""
    from ..backends import get_backend
    from .explain_table import format_explain
    from ..rundir import RunDirectory
    from ..spec import load_spec

    backend = get_backend(target)
    job = load_spec(spec, overrides, program_args=program_args)
    fit = backend.check_fit(job)
    click.echo(format_explain(job, backend, RunDirectory.preview(job, run_dir).path, fit,
                              requeue=backend.requeue_policy(job)), nl=False)
    if fit.problems:
        sys.exit(2)


# render's --target may name the local backend by what it prints: the mpirun command.
RENDER_TARGETS = {"mpirun": RUN_DEFAULT}


@click.command()
@spec_options
@click.option("--target", type=BackendName(aliases=RENDER_TARGETS), default=SUBMIT_DEFAULT, show_default=True,
              help="A Slurm batch script (slurm), the local mpirun command (mpirun, or local), or what another "
                   "backend would start.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory to render paths for.")
@user_errors
def render(spec, overrides, program_args, target, run_dir):
    """Print the batch script (or mpirun command) for SPEC, without running anything."""
    from ..backends import get_backend
    from ..spec import load_spec

    backend = get_backend(RENDER_TARGETS.get(target, target))
    # color=True: click would strip escape sequences when stdout is not a terminal, and the
    # script shown must be byte for byte the one submit writes.
    click.echo(backend.plan(load_spec(spec, overrides, program_args=program_args), run_dir).describe(), nl=False, color=True)
