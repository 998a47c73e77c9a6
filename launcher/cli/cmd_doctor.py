"""`jaxlaunch doctor`: this machine's installation, and a spec's container image (launcher/doctor.py)."""

from __future__ import annotations

import sys

import click

from .options import spec_options


@click.command()
@spec_options(required=False)
def doctor(spec, overrides, program_args):
    """Check this machine's installation: MPI, mpi4py, mpi4jax, JAX, Slurm, the runs folder; with
    SPEC, also its container runtime and image (jaxlaunch and MPI there, against this host's)."""
    import os

    from .doctor_checks import exit_code, format_checks, run_checks
    from ..spec import load_spec

    checks = run_checks(os.environ, load_spec(spec, overrides, program_args=program_args) if spec else None)
    click.echo(format_checks(checks))
    sys.exit(exit_code(checks))
