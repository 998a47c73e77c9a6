"""The `jaxlaunch` command: one module per command (cmd_*.py, as torchx's cli/cmd_*.py), each a thin
shell over one library function; what they share (spec options, error handling, argument checks)
is in options.py, and `run` and `submit` start a job through start_job.py. Library errors become
click exceptions here and only here.

The commands import their libraries inside their bodies: `jaxlaunch --help` and every command's
start stay fast (jax, numpy and the backends are imported by the command that needs them)."""

from __future__ import annotations

import click

from .. import __version__
from .cmd_doctor import doctor
from .cmd_drill import drill
from .cmd_explain import explain, render
from .cmd_goodput import goodput
from .cmd_init import init
from .cmd_logs import cancel, logs
from .cmd_plot import plot
from .cmd_results import results
from .cmd_run import run
from .cmd_status import status
from .cmd_submit import submit
from .cmd_watch import watch


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="jaxlaunch")  # also from a checkout that pip never installed
def main():
    """Run a JAX job spec locally under mpirun, or on Slurm."""


for command in (run, drill, explain, render, submit, status, plot, watch, goodput, logs, cancel, doctor, init,
                results):
    main.add_command(command)

__all__ = ["main", *(c.name for c in main.commands.values())]
