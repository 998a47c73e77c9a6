"""Slurm's part of `jaxlaunch status`: which jobs and sweeps it lists (jaxlaunch's index), its
table (JOBID, STATE, ELAPSED/LIMIT, NODES, RUN DIR) from one batched query, and the words for an
id nobody knows and for a Slurm that cannot be asked. The table's assembly, the sweeps' summary
lines and the lines under the table are every backend's (launcher/cli/status_table.py)."""

from __future__ import annotations

from ...errors import SchedulerError
from ...states import JobState
from ..base import StatusRows
from . import index

HEADERS = ["JOBID", "STATE", "ELAPSED/LIMIT", "NODES", "RUN DIR"]
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


def job_rows(backend, jobs) -> StatusRows:
    """One row per job Slurm or the index knows, from one batched scheduler query for all of
    them (and one scontrol call for the run directories the index lacks); `unknown` the others."""
    if jobs:
        backend.states(jobs)
        backend.fill_run_dirs(jobs)
    rows, known, unknown = [], [], []
    for job in jobs:
        info = job.info()
        if info is None and job.run is None:
            unknown.append(job.id)
            continue
        known.append(job)
        if info is None:  # Slurm forgot it (MinJobAge); its last state is final, or unknown from here
            state = job.status().state
            shown = str(state) if state.final else f"unknown: Slurm no longer knows it (last seen {state})"
            rows.append([job.id, shown, "", "", str(job.run_dir)])
        else:
            state = job.state()
            shown = info.describe_state() if state == JobState.parse(info.state) else str(state)
            rows.append([job.id, shown, info.describe_elapsed(), info.nodes, str(job.run_dir or "")])
    return StatusRows(HEADERS, rows, known, unknown)


def unknown_ids_message(job_ids: list[str]) -> str:
    plural = "s" if len(job_ids) > 1 else ""
    return (f"no job{plural} {', '.join(job_ids)} known to Slurm or to jaxlaunch (index: {index.jobs_index()}).\n"
            f"  fix: check the id{plural} with `squeue --me` or `jaxlaunch status`.")


def not_asked_line(job_ids: list[str], error: SchedulerError) -> str:
    """One line for `jaxlaunch status` when Slurm could not be asked about the jobs jaxlaunch
    submitted: why, and the fix when there is one."""
    said = [line.strip() for line in error.stderr.splitlines() if line.strip()]
    why = getattr(error, "why", "") or (said[-1] if said else f"{error.argv[0]} exited {error.returncode}")
    plural = "s" if len(job_ids) > 1 else ""
    line = f"Slurm could not be asked about the {len(job_ids)} job{plural} jaxlaunch submitted: {why}"
    fix = getattr(error, "fix", None)
    return line + (f"; fix: {fix}" if fix else "")
