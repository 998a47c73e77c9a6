"""`jaxlaunch init`: a new job that runs as written (launcher/scaffold/)."""

from __future__ import annotations

import click

from .options import user_errors



@click.command()
@click.argument("name")
@click.option("--template", type=click.Choice(["minimal", "data-parallel", "sharded"]), default="minimal",
              show_default=True, help="What the new job does.")
@user_errors
def init(name, template):
    """Write NAME.yaml and NAME.py: a job that runs as written (`jaxlaunch run NAME.yaml`)."""
    from ..scaffold import write_job

    for path in write_job(name, template):
        click.echo(f"wrote {path}")
