"""How a command finds the job it names: `find_known_job`, the one way every command that takes a
job id finds it, so a wrong id gets the same answer in each; and `wait_for` (`submit --wait`)."""

from __future__ import annotations

from ..backends import find_job, get_backend
from ..backends.records import NoRunDirectory
from ..states import JobState


def find_known_job(job_id_or_run_dir, needs_run_dir: bool = False):
    """The handle on the job a command names (a job id or a run directory). UsageError (exit 2,
    with the fix) for an id that neither its backend nor jaxlaunch's records know, and, with
    `needs_run_dir`, for a job without a run directory (logs, goodput and plot read it: a Slurm
    job jaxlaunch did not submit). The backend is asked only about an id nothing here knows."""
    job = find_job(job_id_or_run_dir)
    if job.run is None:
        if not job.exists():
            raise get_backend(job.backend).unknown_jobs([job.id])
        if needs_run_dir:
            raise NoRunDirectory(job.id, job.backend, job.records_index())
    return job


def wait_for(job, echo) -> JobState:
    """`--wait`: follow one job to its end, echoing each state change (with the scheduler's
    reason while it waits), then its root cause if it did not complete."""
    from .job_views import wait_line

    def changed(handle, state):
        echo(wait_line(handle.id, state, handle.pending_reason() if state == JobState.PENDING else ""))

    state = job.wait(on_change=changed)
    if state != JobState.COMPLETED:
        for line in job.failure_lines():
            echo(line)
    return state
