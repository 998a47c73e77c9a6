"""The `jaxlaunch` command. Each command is a thin shell over one library function; library
errors become click exceptions here and only here."""

from __future__ import annotations

import functools
import os
import re
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


def spec_options(command=None, *, required=True):
    """SPEC plus the --set overrides and --print-spec that every command reading a spec takes."""
    if command is None:
        return functools.partial(spec_options, required=required)

    @functools.wraps(command)
    @_user_errors
    def print_or_run(*args, print_spec, **kwargs):
        if print_spec and kwargs["spec"] is None:
            raise click.UsageError("--print-spec needs SPEC")
        if print_spec:
            from .spec import describe_spec, load_spec
            click.echo(describe_spec(load_spec(kwargs["spec"], kwargs["overrides"])))
            return None
        return command(*args, **kwargs)

    print_or_run = click.option("--print-spec", is_flag=True,
                                help="Print every resolved spec value with its type, and exit.")(print_or_run)
    print_or_run = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                                help="Override a spec key, dotted for nested keys (e.g. slurm.partition=gpu).")(print_or_run)
    return click.argument("spec", type=click.Path(dir_okay=False), required=required)(print_or_run)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jaxlaunch")
def main():
    """Run a JAX job spec locally under mpirun, or on Slurm."""


@main.command()
@spec_options(required=False)
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default: runs/NAME-TIME).")
@click.option("--dry-run", is_flag=True, help="Print the command and environment; run nothing.")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), metavar="RUN_DIR",
              help="Continue a preempted, failed or cancelled run in its own run directory (with its spec).")
@_user_errors
def run(spec, overrides, run_dir, dry_run, resume_dir):
    """Run SPEC on this machine: nodes x processes_per_node processes under mpirun."""
    from .local import find_mpirun, plan_local_run, resume_local, run_local
    from .rundir import RunDirectory
    from .spec import load_spec

    if resume_dir is not None:
        if spec is not None or overrides or run_dir is not None or dry_run:
            raise click.UsageError("--resume RUN_DIR runs the spec saved in RUN_DIR: give no SPEC, --set, "
                                   "--run-dir or --dry-run with it")
        sys.exit(resume_local(resume_dir, echo=lambda m: click.echo(m, err=True), print_result=click.echo))
    if spec is None:
        raise click.UsageError("missing SPEC (or --resume RUN_DIR)")
    job = load_spec(spec, overrides)
    if dry_run:
        plan = plan_local_run(job, RunDirectory.preview(job, run_dir), find_mpirun(), sys.executable,
                              os.geteuid() == 0)
        click.echo(plan.describe())
        return
    find_mpirun()  # fails with a clear message before a run directory exists
    exit_code = run_local(job, RunDirectory.create(job, run_dir), echo=lambda m: click.echo(m, err=True),
                          print_result=click.echo)
    sys.exit(exit_code)


@main.command()
@spec_options
@click.option("--target", type=click.Choice(["slurm", "mpirun"]), default="slurm", show_default=True,
              help="A Slurm batch script, or the local mpirun command.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory to render paths for.")
@_user_errors
def render(spec, overrides, target, run_dir):
    """Print the batch script (or mpirun command) for SPEC, without running anything."""
    from .local import find_mpirun, plan_local_run
    from .rundir import RunDirectory
    from .slurm.jobs import render_for_submission
    from .spec import load_spec

    job = load_spec(spec, overrides)
    run = RunDirectory.preview(job, run_dir)
    if target == "slurm":
        click.echo(render_for_submission(job, run.path), nl=False)
    else:
        click.echo(plan_local_run(job, run, find_mpirun(), sys.executable, os.geteuid() == 0).describe())


@main.command()
@spec_options
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default: runs/NAME-TIME).")
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow the job until it ends; exit 0 only if it COMPLETED.")
@click.option("--parsable", is_flag=True, help="Print only the job id.")
@_user_errors
def submit(spec, overrides, run_dir, dry_run, wait, parsable):
    """Submit SPEC to Slurm with sbatch."""
    from .rundir import RunDirectory
    from .slurm.jobs import render_for_submission, submit_job, wait_for_job
    from .spec import load_spec

    job = load_spec(spec, overrides)
    preview = render_for_submission(job, RunDirectory.preview(job, run_dir).path)  # fails before any folder exists
    if dry_run:
        click.echo(preview, nl=False)
        return
    run = RunDirectory.create(job, run_dir)
    job_id = submit_job(job, run)
    # With --wait, stdout is for the result, as with `run`; the job id goes to stderr with the progress.
    click.echo(job_id if parsable else f"Submitted job {job_id}; run directory: {run.path}", err=wait)
    if wait:
        from .supervisor import EXIT_TIMEOUT, result_text

        info = wait_for_job(job_id, echo=lambda m: click.echo(m, err=True))
        text = result_text(run) if info.state == "COMPLETED" else None
        if text is not None:
            click.echo(text)
        sys.exit({"COMPLETED": 0, "TIMEOUT": EXIT_TIMEOUT}.get(info.state, 1))


def _job_ids(ctx, param, value):
    """Slurm job ids are numbers (an array task: 123_4); anything else is a usage error."""
    for job_id in (value if isinstance(value, tuple) else (value,)):
        if not re.fullmatch(r"\d+(_\d+)?", job_id):
            raise click.BadParameter(f"{job_id!r} is not a Slurm job id (a number, e.g. 12345)")
    return value


@main.command()
@click.argument("job_ids", nargs=-1, callback=_job_ids)
@_user_errors
def status(job_ids):
    """Show state, elapsed time, nodes and run directory of jobs (default: those jaxlaunch submitted)."""
    from tabulate import tabulate

    from .slurm.jobs import (failure_lines, find_run_dir, known_job_ids, requeue_line, status_table,
                             unknown_jobs_error)

    ids = list(job_ids) or known_job_ids()[:20]
    if not ids:
        click.echo("no jobs submitted with jaxlaunch yet")
        return
    rows, unknown = status_table(ids)
    if rows:
        click.echo(tabulate(rows, headers=["JOBID", "STATE", "ELAPSED", "NODES", "RUN DIR"]))
    for row in rows:
        run = find_run_dir(row[0]) if row[4] else None
        requeued = requeue_line(run)
        if requeued:
            click.echo(f"job {row[0]} {requeued}")
        if job_ids and row[1] in ("FAILED", "TIMEOUT", "CANCELLED"):  # explain the jobs asked about
            for line in failure_lines(run):
                click.echo(f"job {row[0]} {line}")
    if unknown:
        raise unknown_jobs_error(unknown)


@main.command()
@click.argument("job_id", callback=_job_ids)
@click.option("--rank", type=int, help="Show this rank's full log instead of the job's combined output.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@_user_errors
def logs(job_id, rank, follow):
    """Print a job's output."""
    from .slurm.jobs import failure_lines, find_run_dir, stream_log

    stream_log(job_id, rank, follow, write=lambda text: click.echo(text, nl=False))
    for line in failure_lines(find_run_dir(job_id)):  # after the log, on stderr: the log stays clean
        click.echo(line, err=True)


@main.command()
@click.argument("job_id", callback=_job_ids)
@_user_errors
def cancel(job_id):
    """Cancel a job."""
    from .slurm.jobs import cancel_job

    cancel_job(job_id)
    click.echo(f"cancelled job {job_id}")
