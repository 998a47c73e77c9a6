"""The `jaxlaunch` command. Each command is a thin shell over one library function; library
errors become click exceptions here and only here."""

from __future__ import annotations

import functools
import os
import sys

import click

from .errors import JaxlaunchError


class _UserError(click.ClickException):
    """A library error shown as 'Error: ...' with its own exit code, never a traceback."""

    def __init__(self, error: JaxlaunchError):
        super().__init__(str(error))
        self.exit_code = error.exit_code


def _user_errors(command):
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except JaxlaunchError as error:
            raise _UserError(error) from None
    return wrapper


def spec_options(command):
    """SPEC plus the --set overrides every command that reads a spec takes."""
    command = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                           help="Override a spec key, dotted for nested keys (e.g. slurm.partition=gpu).")(command)
    return click.argument("spec", type=click.Path(dir_okay=False))(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jaxlaunch")
def main():
    """Run a JAX job spec locally under mpirun, or on Slurm."""


@main.command()
@spec_options
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default: runs/NAME-TIME).")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@_user_errors
def run(spec, overrides, run_dir, dry_run):
    """Run SPEC on this machine: nodes x processes_per_node processes under mpirun."""
    from .local import find_mpirun, plan_local_run, run_local
    from .rundir import RunDirectory
    from .spec import load_spec

    job = load_spec(spec, overrides)
    if dry_run:
        target = RunDirectory(run_dir or job.run_dir or f"runs/{job.name}-TIME")
        click.echo(plan_local_run(job, target, find_mpirun(), sys.executable, os.geteuid() == 0).describe())
        return
    exit_code = run_local(job, RunDirectory.create(job, run_dir), echo=lambda m: click.echo(m, err=True))
    sys.exit(exit_code)
