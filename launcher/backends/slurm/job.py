"""SlurmJob: the handle on one Slurm job (or array task) that jaxlaunch submitted: its state, from
the run directory while the job's supervisor reports and from the watcher (watcher.py) otherwise,
its record for `jaxlaunch status` (records.JobInfo: squeue's pending reason, elapsed time, nodes,
requeues and spare swaps), its logs and its cancel.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import SchedulerError, UnknownJobError, UsageError
from ...rundir import RunDirectory
from . import index, scheduler
from .index import sweep_dir_of
from .watcher import SlurmWatcher, shared_watcher
from ...states import CANCEL_EVENT, JobState
from ..base import Job, JobInfo, history_fields

# A running job whose supervisor keeps status.json fresh: Slurm is asked this seldom (issue 45's
# citizenship: 30 s per waiting client); the supervisor writes it at least every STILL_WRITE_SECONDS.
RUNNING_REFRESH, SUPERVISOR_SILENT = 30.0, 60.0
# How long `cancel` lets a running job's supervisor collect stacks and end its ranks (it takes
# attempt.ANSWER_SECONDS + TERMINATE_SECONDS at most) before Slurm ends the job.
CANCEL_GRACE_SECONDS = 15.0
# The states the supervisor inside the batch job writes when the job ends; it knows better than
# Slurm why (TIMEOUT from the spec's own timeout, not Slurm's FAILED for exit code 124).
SUPERVISOR_FINAL_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)


class SlurmJob(Job):
    backend = "slurm"
    scheduler_name = "Slurm"

    def records_index(self) -> Path:
        """A Slurm job that jaxlaunch did not submit from this account is not in its index."""
        return index.jobs_index()

    def __init__(self, job_id: str, run: RunDirectory | None, watcher: SlurmWatcher | None = None):
        super().__init__(job_id, run)
        self.watcher = watcher or shared_watcher()
        self.watcher.follow(job_id)

    def slurm_record(self, max_age: float | None = None) -> scheduler.SlurmRecord | None:
        """Slurm's view (state, elapsed, nodes, pending reason); None once Slurm forgot the job."""
        return self.watcher.info(self.id, max_age)

    def state(self) -> JobState:
        status = self.status()
        if status.state in SUPERVISOR_FINAL_STATES:
            return status.state
        # While the job's own supervisor says RUNNING and keeps writing status.json (every few s), the
        # run directory knows the state: Slurm is asked only every RUNNING_REFRESH, for a death the
        # supervisor cannot report (a node lost, the job's time limit). A 27 s job made 7 squeue calls.
        info = self.slurm_record(max_age=RUNNING_REFRESH if self._supervisor_reports(status) else None)
        if info is None:  # Slurm forgot it (or never knew the id)
            return status.state if status.state.final else JobState.UNKNOWN
        state = JobState.parse(info.state)
        if info.finished and self.run is not None and status.state != state:
            # Slurm ended it without the supervisor's word (cancelled while pending, its time limit,
            # a node failure): record that for `status` and later handles.
            self.run.update_status(state=state, slurm_state=info.slurm_state, exit_code=info.exit_code or None,
                                   ended=time.time())
        return state

    def _supervisor_reports(self, status) -> bool:
        """The batch job's supervisor says RUNNING and wrote status.json within SUPERVISOR_SILENT."""
        if status.state != JobState.RUNNING or self.run is None:
            return False
        try:
            return time.time() - self.run.status_file.stat().st_mtime < SUPERVISOR_SILENT
        except OSError:
            return False

    def exists(self) -> bool:
        """Known to the index (a run directory), else to Slurm (one batched query)."""
        return self.run is not None or self.slurm_record() is not None

    def pending_reason(self) -> str:
        """squeue's reason ('Resources'), when Slurm's last answer is that the job waits."""
        record = self.watcher.last_known(self.id)
        return record.pending_reason if record is not None else ""

    def info(self) -> JobInfo:
        """Slurm's view of the job (asked through the watcher) beside its run directory's. A job Slurm
        has forgotten (MinJobAge) shows its run directory's last state; one with neither is a wrong id."""
        record = self.slurm_record()
        if record is None:
            status = self.status()
            return JobInfo(self.id, self.backend, status.state, self.run_dir, scheduler_knows=False,
                           **history_fields(status))
        state = self.state()
        same = state == JobState.parse(record.state)  # else the supervisor knows better than Slurm
        return JobInfo(self.id, self.backend, state, self.run_dir, reason=record.pending_reason if same else "",
                       elapsed=record.elapsed, time_limit=record.limit, nodes=record.nodes,
                       **history_fields(self.status()))

    def logs(self, rank: int | None = None) -> str:
        path = self.log_path(rank)
        return path.read_text(errors="replace") if path.exists() else ""

    def log_path(self, rank: int | None = None) -> Path:
        if self.run is None:
            raise UsageError(f"no run directory known for job {self.id}: it was not submitted by jaxlaunch "
                             f"from this account (index: {index.jobs_index()})")
        if rank is not None:
            return self.rank_log(rank)
        # an array task's output is the array's (SWEEP_DIR/logs/slurm-%A_%a.out), recorded at submission
        return Path(self.status().log or self.run.path / f"slurm-{self.id}.out")

    def follow_logs(self, rank: int | None, write, poll_seconds: float = 0.5) -> None:
        """Print the log as it grows, until the job has ended and the file stops growing."""
        path = self.log_path(rank)
        offset = 0
        while True:
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                if chunk:
                    write(chunk.decode(errors="replace"))
                    offset += len(chunk)
            if self.done() and (not path.exists() or path.stat().st_size == offset):
                return
            time.sleep(poll_seconds)

    def cancel(self) -> None:
        """End the job as CANCELLED, never requeued. A running job's supervisor is asked first
        (SIGTERM to the batch shell alone): it collects every rank's stacks into failure.json and
        ends the ranks, as a local cancel does. Slurm's own cancel signals every process of the job
        at once, and mpirun then kills its ranks before they can answer. Then scancel, which
        releases the nodes (and ends a pending job). An id Slurm does not know is an error
        (scancel itself exits 0 for it)."""
        info = self.slurm_record(max_age=0)
        if info is None:
            raise UnknownJobError(f"job {self.id} is not known to Slurm: nothing to cancel.\n"
                                  f"  fix: check the id with `squeue --me` or `jaxlaunch status`.")
        runs = self._runs()
        for run in runs:
            # Before any signal: the supervisor reads it to tell this SIGTERM from a preemption's.
            run.log_event(CANCEL_EVENT, by="jaxlaunch cancel")
        supervised = [run for run in runs if run.status().state == JobState.RUNNING]
        if supervised and info.state == JobState.RUNNING:
            try:
                scheduler.call_slurm(["scancel", "--batch", "--signal=TERM", self.id])
            except SchedulerError:
                pass  # it is ending already; the scancel below still ends it
            deadline = time.monotonic() + CANCEL_GRACE_SECONDS
            while time.monotonic() < deadline and not all(run.status().state.final for run in supervised):
                time.sleep(0.2)
        try:
            scheduler.cancel(self.id)
        except SchedulerError:
            # Its supervisor ended it meanwhile (it scancels its own job after a cancel): fine.
            now = self.slurm_record(max_age=0)
            if now is not None and not now.finished:
                raise
        self.watcher.forget(self.id)
        for run in runs:
            if run.status().state == JobState.SUBMITTED:
                # It never started, so no supervisor will record its end (and Slurm soon forgets
                # a cancelled pending array task).
                run.update_status(state=JobState.CANCELLED, ended=time.time(), reason="cancelled before it started")

    def _runs(self) -> list[RunDirectory]:
        """This job's run directory, or every task's for an array id."""
        if self.run is not None:
            return [self.run]
        sweep = sweep_dir_of(self.id)
        if sweep is None:
            return []
        return [run for task, run in sweep.task_runs() if task.get("job_id", "").startswith(f"{self.id}_")]
