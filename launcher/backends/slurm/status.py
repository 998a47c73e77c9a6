"""Slurm's part of `jaxlaunch status`: which jobs and sweeps it lists (jaxlaunch's index), and their
records (JobInfo: state, pending reason, elapsed/limit, nodes) from one batched query. The table,
the sweeps' summary lines and the lines under the table are the CLI's (launcher/cli/status_table.py,
job_views.py)."""

from __future__ import annotations

from ..base import JobInfo
from . import index

LISTED = 20  # the newest jobs (and sweeps) of the index that `status` lists without ids


def listed_ids() -> list[str]:
    """The ids `jaxlaunch status` lists without arguments: the newest in the index."""
    return index.known_job_ids()[:LISTED]


def split_sweeps(job_ids: list[str], skip_missing: bool = False):
    """(sweep directories, the other ids): an array id jaxlaunch submitted names its sweep. With
    `skip_missing`, a sweep whose directory is gone (deleted since) is left out, not an error."""
    sweeps, others = [], []
    for job_id in job_ids:
        directory = index.sweep_dir_of(job_id)
        if directory is None:
            others.append(job_id)
        elif not (skip_missing and not directory.sweep_file.is_file()):
            sweeps.append(directory)
    return sweeps, others


def job_infos(backend, jobs) -> list[JobInfo]:
    """One record per job, from one batched scheduler query for all of them (and one scontrol
    call for the run directories the index lacks); an id nobody knows gets one that says so."""
    if jobs:
        backend.states(jobs)
        backend.fill_run_dirs(jobs)
    return [job.info() for job in jobs]
