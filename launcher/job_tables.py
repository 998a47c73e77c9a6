"""What `jaxlaunch status` prints: tables of jobs, sweeps and recent local runs, built from the
backends' handles (the presentation only; every state comes from a handle); and `find_known_job`,
the one way every command that takes a job id finds it, so a wrong id gets the same answer in each."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tabulate import tabulate

from .backends import find_job, is_job_id
from .backends.local.backend import LocalBackend, LocalJob
from .backends.slurm.backend import SlurmBackend, SlurmJob, sweep_dir_of
from .errors import SchedulerError, UsageError
from .backends.slurm.index import jobs_index
from .states import JobState

EXPLAINED_STATES = (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)


def _shown_path(path) -> str:
    """A path under the working directory as the user typed it (runs/...), others absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def local_run_row(job: LocalJob) -> list[str]:
    """LOCAL RUN, STATE, DURATION, RESULT (the result's scalars, or the failure, shortened)."""
    status = job.status()
    seconds = (status.ended or time.time()) - status.started if status.started else None
    summary = ""
    try:
        value = json.loads(job.run.result_file.read_text())
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if isinstance(v, (int, float, str, bool))}
        summary = json.dumps(value)
    except (OSError, ValueError):
        failure = job.failure()
        summary = failure["summary"] if failure else ""
    return [_shown_path(job.run_dir), str(job.state()), "" if seconds is None else f"{seconds:.1f} s",
            summary if len(summary) <= 60 else summary[:57] + "..."]


def progress_lines(job, name: str, verbose: bool, echo) -> None:
    """'job 12 step 420/1000 (42%), 12.3 steps/s, ETA 47 s; loss=0.123' (and, verbose, each rank's
    step time) for a job that reports progress (ctx.report); for one that has ended, the steps it
    did ('job 12 1000/1000 steps (100%), ...')."""
    progress = job.progress()
    if progress is None:
        return
    echo(f"{name} {progress.line(ended=job.state().final)}")
    if progress.slow_line():
        echo(f"{name} {progress.slow_line()}")
    if verbose:
        for line in progress.rank_lines():
            echo(line)


def slurm_job_rows(jobs: list[SlurmJob]) -> tuple[list[list[str]], list[SlurmJob]]:
    """(rows JOBID, STATE, ELAPSED/LIMIT, NODES, RUN DIR for the jobs Slurm or the index knows,
    the unknown ones). One batched scheduler query for all of them."""
    if jobs:
        backend = SlurmBackend(jobs[0].watcher)
        backend.states(jobs)
        backend.fill_run_dirs(jobs)
    rows, unknown = [], []
    for job in jobs:
        info = job.info()
        if info is None and job.run is None:
            unknown.append(job)
        elif info is None:
            rows.append([job.id, f"{job.status().state} (no longer known to Slurm)", "", "", str(job.run_dir)])
        else:
            state = job.state()
            shown = info.describe_state() if state == JobState.parse(info.state) else str(state)
            rows.append([job.id, shown, info.describe_elapsed(), info.nodes, str(job.run_dir or "")])
    return rows, unknown


def unknown_jobs_error(job_ids: list[str]) -> UsageError:
    plural = "s" if len(job_ids) > 1 else ""
    return UsageError(f"no job{plural} {', '.join(job_ids)} known to Slurm or to jaxlaunch (index: {jobs_index()}).\n"
                      f"  fix: check the id{plural} with `squeue --me` or `jaxlaunch status`.")


def find_known_job(job_id_or_run_dir, needs_run_dir: bool = False):
    """The handle on the job a command names (a job id or a run directory). UsageError (exit 2,
    with the fix) for an id that neither Slurm nor jaxlaunch's index knows, and, with
    `needs_run_dir`, for a Slurm job jaxlaunch did not submit (logs, goodput and plot read the run
    directory). Slurm is asked only about an id the index does not know."""
    job = find_job(job_id_or_run_dir)
    if isinstance(job, SlurmJob) and job.run is None:
        if job.info() is None:
            raise unknown_jobs_error([job.id])
        if needs_run_dir:
            raise UsageError(job.no_run_dir_message())
    return job


def slurm_not_asked_line(job_ids: list[str], error: SchedulerError) -> str:
    """One line for `jaxlaunch status` when Slurm could not be asked about the jobs jaxlaunch
    submitted: why, and the fix when there is one."""
    said = [line.strip() for line in error.stderr.splitlines() if line.strip()]
    why = getattr(error, "why", "") or (said[-1] if said else f"{error.argv[0]} exited {error.returncode}")
    plural = "s" if len(job_ids) > 1 else ""
    line = f"Slurm could not be asked about the {len(job_ids)} job{plural} jaxlaunch submitted: {why}"
    fix = getattr(error, "fix", None)
    return line + (f"; fix: {fix}" if fix else "")


def print_status(job_ids: list[str], verbose: bool, echo) -> None:
    """`jaxlaunch status [IDS]`: the jobs asked about (default: those jaxlaunch submitted, and the
    recent local runs), a count of task states per sweep, the root cause of those that failed.
    Without ids, Slurm's part is one line when Slurm cannot be asked (the local runs still show)."""
    slurm = SlurmBackend()
    run_dirs = [i for i in job_ids if not is_job_id(i) and not (Path(i) / "sweep.json").is_file()]
    job_ids = [i for i in job_ids if i not in run_dirs]
    local_runs = []
    for folder in run_dirs:  # a run directory: its local run, or the Slurm job that ran in it
        job = LocalBackend().find(folder)
        if job.status().backend == "slurm" and job.status().job_id:
            job_ids.append(job.status().job_id)
        else:
            local_runs.append(job)
    ids = list(job_ids) or ([] if run_dirs else slurm.known_job_ids()[:20])
    if local_runs:
        echo(tabulate([local_run_row(job) for job in local_runs], headers=["LOCAL RUN", "STATE", "DURATION", "RESULT"]))
        for job in local_runs:
            progress_lines(job, _shown_path(job.run_dir), verbose, echo)
            if job.state() in EXPLAINED_STATES:
                for line in job.failure_lines():
                    echo(f"{_shown_path(job.run_dir)} {line}")
        if ids:
            echo("")
    if not job_ids and not run_dirs:
        recent = LocalBackend().recent()
        local = [local_run_row(job) for job in recent]
        if local:
            echo(tabulate(local, headers=["LOCAL RUN", "STATE", "DURATION", "RESULT"]))
            for job in recent:
                if not job.state().final:
                    progress_lines(job, _shown_path(job.run_dir), verbose, echo)
            if ids:
                echo("")
        elif not ids:
            echo("no jobs submitted with jaxlaunch yet, and no local runs in runs/")
            return
    if job_ids or run_dirs:
        _print_slurm_jobs(ids, job_ids, verbose, echo)
        return
    try:  # the default listing: the local runs above stand even when Slurm cannot be asked
        _print_slurm_jobs(ids, job_ids, verbose, echo)
    except SchedulerError as error:
        echo(slurm_not_asked_line(ids, error))


def _print_slurm_jobs(ids: list[str], job_ids: list[str], verbose: bool, echo) -> None:
    """The sweeps and Slurm jobs of `status`; `job_ids`: those the user named (explained in full)."""
    from .backends.slurm.array_status import summary_line, task_states
    from .sweeps.directory import SweepDirectory

    sweeps = [SweepDirectory(i) if not is_job_id(i) else sweep_dir_of(i) for i in ids]
    for path in dict.fromkeys(d.path for d in sweeps if d is not None):
        directory = SweepDirectory(path)
        states = task_states(directory)
        echo(summary_line(directory, states))
        if verbose:
            keys = directory.read()["keys"]
            echo(tabulate([[t.folder, t.job_id, t.state, t.elapsed, *(t.values.get(k) for k in keys)]
                           for t in states], headers=["TASK", "JOBID", "STATE", "ELAPSED", *keys]))
    jobs = SlurmBackend().find_many([i for i, d in zip(ids, sweeps) if d is None])
    if not jobs:
        return
    rows, unknown = slurm_job_rows(jobs)
    if rows:
        echo(tabulate(rows, headers=["JOBID", "STATE", "ELAPSED/LIMIT", "NODES", "RUN DIR"]))
    for job in jobs:
        if job in unknown:
            continue
        requeued = job.requeue_line()
        if requeued:
            echo(f"job {job.id} {requeued}")
        if job_ids or not job.state().final:
            progress_lines(job, f"job {job.id}", verbose, echo)
        if job_ids and job.state() in EXPLAINED_STATES:  # explain the jobs asked about
            for line in job.failure_lines():
                echo(f"job {job.id} {line}")
    if unknown:
        raise unknown_jobs_error([job.id for job in unknown])


def wait_for(job, echo) -> JobState:
    """`--wait`: follow one job to its end, echoing each state change (with squeue's pending
    reason), then its root cause if it did not complete."""
    def changed(handle, state):
        info = handle.info() if isinstance(handle, SlurmJob) else None
        shown = info.describe_state() if info is not None and JobState.parse(info.state) == state else str(state)
        echo(f"job {handle.id}: {shown}")

    state = job.wait(on_change=changed)
    if state != JobState.COMPLETED:
        for line in job.failure_lines():
            echo(line)
    return state


__all__ = ["print_status", "wait_for", "find_known_job", "local_run_row", "slurm_job_rows", "unknown_jobs_error"]
