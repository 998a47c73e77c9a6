"""What `run` and `submit` share: one path from a spec (or a sweep) to a started job, over any
backend of the registry.

- `run` keeps the job in the foreground. A backend that runs jobs in this process does so (the
  local backend: the supervisor here, the program's signals, streams and exit code its own, as
  under `mpirun`); any other is started and followed to its end, with the job's exit code, and
  Ctrl-C (or SIGTERM) cancels it, as either ends a local run's job (srun waits for a second
  Ctrl-C within a second; one is enough here).
- `submit` starts the job and returns with its id, or follows it with --wait; Ctrl-C then stops
  only the following.
Progress goes to stderr; stdout is for the result (and for submit's id without --wait).
"""

from __future__ import annotations

import signal
import sys
import threading

import click

from ..states import JobState
from .options import is_sweep, print_results_table, progress


def start(backend, job, run_dir, max_parallel, *, dry_run: bool, foreground: bool, wait: bool = False,
          parsable: bool = False, check: bool = True) -> None:
    """Start `job` (a JobSpec or a Sweep) on `backend`; exits with the job's code when it was followed."""
    if dry_run:  # what --dry-run shows is what starts
        click.echo(backend.plan(job, run_dir, max_parallel).describe(), nl=False, color=True)
    elif is_sweep(job):
        _start_sweep(backend, job, run_dir, max_parallel, foreground, wait, parsable, check)
    else:
        _start_one(backend, backend.plan(job, run_dir), foreground, wait, parsable, check)


def _start_one(backend, plan, foreground, wait, parsable, check) -> None:
    if foreground:
        here = backend.run_in_foreground(plan, echo=progress, print_result=click.echo)
        if here is not None:
            sys.exit(here.exit_code())
    handle = backend.start_plan(plan, check=check)
    for warning in handle.warnings:
        progress(f"warning: {warning}")
    following = foreground or wait
    # While it is followed, stdout is for the result, as with a local run; the id goes to stderr.
    click.echo(handle.id if parsable else f"Submitted job {handle.id}; run directory: {handle.run_dir}",
               err=following)
    if following:
        _follow(handle, cancel_on_interrupt=foreground)


class Stopped(BaseException):
    """SIGTERM to a `run` that follows its job: ended as Ctrl-C ends it."""


def _on_sigterm(signum, frame):
    raise Stopped


def _until_stopped(follow, ids: list[str], cancel, cancels: bool):
    """follow()'s answer; on Ctrl-C (or, when `cancels`, SIGTERM) `cancel()` first when `cancels`
    (run), else only the following ends (submit --wait), and the exit is 128 + the signal."""
    previous = None
    if cancels and threading.current_thread() is threading.main_thread():
        # A local run's job ends with `jaxlaunch run` on SIGTERM too (its supervisor's): so here.
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return follow()
    except (KeyboardInterrupt, Stopped) as stop:
        code = 128 + (signal.SIGTERM if isinstance(stop, Stopped) else signal.SIGINT)
        named = f"job{'s' if len(ids) > 1 else ''} {', '.join(ids)}"
        if not cancels:
            goes = "they go" if len(ids) > 1 else "it goes"
            progress(f"jaxlaunch: stopped following {named}; {goes} on (jaxlaunch cancel {' '.join(ids)})")
            sys.exit(code)
        progress(f"jaxlaunch: {'interrupted' if code == 130 else 'terminated'}: cancelling {named}")
        cancel()
        sys.exit(code)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _follow(handle, cancel_on_interrupt: bool) -> None:
    from ..supervisor import result_text
    from .job_lookup import wait_for

    state = _until_stopped(lambda: wait_for(handle, progress), [handle.id], handle.cancel, cancel_on_interrupt)
    if state == JobState.COMPLETED and result_text(handle.run) is not None:
        click.echo(result_text(handle.run))
    sys.exit(handle.exit_code())


def _start_sweep(backend, sweep, run_dir, max_parallel, foreground, wait, parsable, check) -> None:
    if foreground:
        here = backend.run_sweep_in_foreground(sweep, run_dir, max_parallel, echo=progress)
        if here is not None:
            directory, code = here
            print_results_table(directory.path)
            sys.exit(code)
    directory, ids = backend.start_sweep(sweep, run_dir, max_parallel, echo=progress, check=check)
    following = foreground or wait
    if parsable:
        click.echo(",".join(ids), err=following)
    else:
        click.echo(f"Submitted sweep of {len(sweep.configurations)} configurations as job array"
                   f"{'s' if len(ids) > 1 else ''} {', '.join(ids)}; sweep directory: {directory.path}", err=following)
    if following:
        def cancel_all():
            for job_id in ids:  # an array's id stands for all its tasks (Backend.find_to_cancel)
                backend.find_to_cancel(job_id).cancel()

        states = _until_stopped(lambda: backend.wait_for_sweep(directory, echo=progress), ids, cancel_all,
                                foreground)
        print_results_table(directory.path)
        sys.exit(0 if all(t.state == JobState.COMPLETED for t in states) else 1)
