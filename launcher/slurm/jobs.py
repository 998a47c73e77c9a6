"""`jaxlaunch submit/status/logs/cancel`: the Slurm job life cycle on top of scheduler.py."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ..errors import SchedulerError, UsageError
from ..local import find_mpirun
from ..rundir import RunDirectory, atomic_write_json
from ..spec import JobSpec
from . import scheduler
from .render import SCRIPT_NAME, render_batch_script

HOME_ENV = "JAXLAUNCH_HOME"
# States the supervisor inside the batch job writes into status.json when the job ends.
SUPERVISOR_FINAL_STATES = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED")


def jobs_index() -> Path:
    """Folder mapping job ids to run directories, so commands can take a job id alone."""
    return Path(os.environ.get(HOME_ENV, "~/.jaxlaunch")).expanduser() / "jobs"


def render_for_submission(spec: JobSpec, run_dir: Path) -> str:
    return render_batch_script(spec, run_dir=run_dir, workdir=Path.cwd(), python=sys.executable,
                               mpirun=find_mpirun(), is_root=os.geteuid() == 0)


def submit_job(spec: JobSpec, run: RunDirectory) -> str:
    """Write the script into the run directory and sbatch it; returns the job id.

    If sbatch refuses the job, status.json says SUBMIT_FAILED with sbatch's message, and the
    error propagates: no run directory is left looking like a job that ran.
    """
    script = run.path / SCRIPT_NAME
    script.write_text(render_for_submission(spec, run.path))
    script.chmod(0o755)
    try:
        job_id = scheduler.submit(str(script))
    except SchedulerError as exc:
        run.update_status(state="SUBMIT_FAILED", backend="slurm", error=str(exc), ended=time.time())
        raise
    run.update_status(state="SUBMITTED", backend="slurm", job_id=job_id, script=str(script),
                      submitted=time.time())
    jobs_index().mkdir(parents=True, exist_ok=True)
    atomic_write_json(jobs_index() / f"{job_id}.json", {"job_id": job_id, "run_dir": str(run.path)})
    return job_id


def find_run_dir(job_id: str) -> RunDirectory:
    """The run directory of a job: from jaxlaunch's index, else from Slurm's StdOut path."""
    entry = jobs_index() / f"{job_id}.json"
    if entry.exists():
        record = json.loads(entry.read_text())
        if "sweep_dir" in record:
            raise UsageError(f"job {job_id} is the job array of the sweep in {record['sweep_dir']}.\n"
                             f"  fix: name one task as {job_id}_N, or see them all with `jaxlaunch status {job_id} -v`.")
        return RunDirectory(record["run_dir"])
    try:
        record = scheduler.parse_scontrol_record(
            scheduler.call_slurm(["scontrol", "show", "job", "--oneliner", str(job_id)]))
        if record.get("StdOut"):
            run = RunDirectory(Path(record["StdOut"]).parent)
            if run.spec_file.exists():
                return run
    except SchedulerError:
        pass
    raise UsageError(f"no run directory known for job {job_id}: it was not submitted by jaxlaunch "
                     f"from this account (index: {jobs_index()})")


def job_status(job_id: str) -> tuple[scheduler.JobInfo | None, RunDirectory | None]:
    """Slurm's view of the job, and its run directory (status.json updated once the job ended)."""
    try:
        run = find_run_dir(job_id)
    except UsageError:
        run = None
    info = scheduler.query_job(job_id)
    if run is not None and info is not None and info.finished:
        status = run.read_status()
        if status.get("state") in SUPERVISOR_FINAL_STATES:
            # The job's supervisor wrote why it ended (TIMEOUT from its own timeout, not Slurm's
            # FAILED for exit code 124); it knows better than Slurm's state.
            info = dataclasses.replace(info, state=status["state"])
        elif status.get("state") != info.state:
            run.update_status(state=info.state, slurm_state=info.slurm_state, exit_code=info.exit_code,
                              ended=time.time())
    return info, run


def failure_lines(run: RunDirectory | None) -> list[str]:
    """The root-cause summary of a failed job, from the failure.json its supervisor wrote."""
    failure = run.read_failure() if run is not None else None
    if failure is None:
        return []
    from ..supervisor.root_cause import summary_lines

    return summary_lines(failure, run.path)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def requeue_line(run: RunDirectory | None) -> str | None:
    """'requeued 2 times: 1 preemption, 1 time limit' for a job that requeued itself, else None."""
    status = run.read_status() if run is not None else {}
    requeues = int(status.get("requeues", 0))
    if not requeues:
        return None
    return (f"requeued {_count(requeues, 'time')}: {_count(int(status.get('preemptions', 0)), 'preemption')}, "
            f"{_count(int(status.get('timeouts', 0)), 'time limit')}")


def status_table(job_ids: list[str]) -> tuple[list[list[str]], list[str]]:
    """(rows for the known jobs, ids neither Slurm nor jaxlaunch's index knows)."""
    rows, unknown = [], []
    for job_id in job_ids:
        info, run = job_status(job_id)
        if info is None and run is None:
            unknown.append(job_id)
        elif info is None:
            state = run.read_status().get("state", "UNKNOWN") + " (no longer known to Slurm)"
            rows.append([job_id, state, "", "", str(run.path)])
        else:
            rows.append([job_id, info.describe_state(), info.describe_elapsed(), info.nodes, str(run.path) if run else ""])
    return rows, unknown


def unknown_jobs_error(job_ids: list[str]) -> UsageError:
    plural = "s" if len(job_ids) > 1 else ""
    return UsageError(f"no job{plural} {', '.join(job_ids)} known to Slurm or to jaxlaunch (index: {jobs_index()}).\n"
                      f"  fix: check the id{plural} with `squeue --me` or `jaxlaunch status`.")


def status_rows(job_ids: list[str]) -> list[list[str]]:
    return status_table(job_ids)[0]


def known_job_ids() -> list[str]:
    """Jobs jaxlaunch submitted from this account, newest first."""
    entries = sorted(jobs_index().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [p.stem for p in entries if "_" not in p.stem]  # an array stands for its tasks


def wait_for_job(job_id: str, echo, poll_seconds: float = 1.0) -> scheduler.JobInfo:
    """Poll until the job ends, echoing each state change; returns the final info."""
    last = None
    while True:
        info, run = job_status(job_id)
        if info is None:
            where = f" (run directory: {run.path})" if run is not None else ""
            raise UsageError(f"job {job_id} is not known to Slurm{where}: it ended and was purged before it was "
                             f"seen to finish, or the id is wrong.\n  fix: see `jaxlaunch logs {job_id}` and the "
                             f"run directory's status.json.")
        if info.describe_state() != last:
            echo(f"job {job_id}: {info.describe_state()}")  # PENDING (Resources), RUNNING, ...
            last = info.describe_state()
        if info.finished:
            if info.state != "COMPLETED":
                for line in failure_lines(run):
                    echo(line)
            return info
        time.sleep(poll_seconds)


def log_path(job_id: str, rank: int | None) -> Path:
    run = find_run_dir(job_id)
    if rank is None:
        # an array task's output is the array's (SWEEP_DIR/logs/slurm-%A_%a.out), recorded at submission
        return Path(run.read_status().get("log") or run.path / f"slurm-{job_id}.out")
    try:
        processes = run.read_spec().num_processes
    except (OSError, ValueError):
        processes = None  # no readable spec.json: only the lower bound can be checked
    if rank < 0 or (processes is not None and rank >= processes):
        if processes is None:
            has, valid = "ranks numbered from 0", "0 and up"
        else:
            valid = "0" if processes == 1 else f"0 to {processes - 1}"
            has = f"{processes} rank{'s' if processes > 1 else ''}: {valid}"
        raise UsageError(f"--rank {rank}: job {job_id} has {has}.\n  fix: pass --rank N with N in {valid}.")
    return run.rank_log(rank)


def stream_log(job_id: str, rank: int | None, follow: bool, write, poll_seconds: float = 0.5) -> None:
    """Print a job's log (rank None: the combined batch output). With follow, keep printing new
    output until the job has ended and the file stops growing."""
    path = log_path(job_id, rank)
    if not follow and not path.exists():
        raise UsageError(f"no log yet at {path}" + ("" if rank is None else f" (does rank {rank} exist?)"))
    offset = 0
    while True:
        if path.exists():
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            if chunk:
                write(chunk.decode(errors="replace"))
                offset += len(chunk)
        if not follow:
            return
        info = scheduler.query_job(job_id)
        if info is None or info.finished:
            if not path.exists() or path.stat().st_size == offset:
                return
        time.sleep(poll_seconds)


def cancel_job(job_id: str) -> None:
    """scancel the job; an id Slurm does not know is an error (scancel itself exits 0 for it)."""
    if scheduler.query_job(job_id) is None:
        raise UsageError(f"job {job_id} is not known to Slurm: nothing to cancel.\n"
                         f"  fix: check the id with `squeue --me` or `jaxlaunch status`.")
    scheduler.cancel(job_id)
    try:
        runs = [find_run_dir(job_id)]
    except UsageError:
        from ..sweeps.array import sweep_dir_of
        sweep = sweep_dir_of(job_id)
        runs = [run for task, run in sweep.task_runs() if task.get("job_id", "").startswith(f"{job_id}_")] \
            if sweep is not None else []
    for run in runs:
        if run.read_status().get("state") == "SUBMITTED":
            # It never started, so no supervisor will record its end (and Slurm soon forgets a
            # cancelled pending array task).
            run.update_status(state="CANCELLED", ended=time.time(), reason="cancelled before it started")
