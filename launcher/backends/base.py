"""The seam every backend implements: `Backend` starts and finds jobs, `Job` is the handle.

A `Job` answers from its run directory (status.json, failure.json, logs) and from its backend
(the scheduler's view, the supervisor's process). `repr` does no I/O. `wait` backs off: it asks
again after 0.5 s, then 1.5 times longer each time the state stays the same, up to `MAX_POLL`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import JobFailedError, UnknownJobError, UsageError
from ..rundir import RunDirectory
from ..states import JobState, StatusRecord

FIRST_POLL, MAX_POLL, BACKOFF = 0.5, 10.0, 1.5


class Job(ABC):
    """A handle on one job: `id`, `run_dir`, and the methods below (the same for every backend)."""

    backend = ""

    def __init__(self, job_id: str, run: RunDirectory | None):
        self.id = job_id
        self.run = run

    @property
    def run_dir(self) -> Path | None:
        return None if self.run is None else self.run.path

    def __repr__(self) -> str:  # no I/O: a notebook shows many of these
        return f"{type(self).__name__}(id={self.id!r}, run_dir={str(self.run_dir)!r})"

    def status(self) -> StatusRecord:
        """status.json as a record (state PENDING before anything wrote it)."""
        return self.run.status() if self.run is not None else StatusRecord()

    @abstractmethod
    def state(self) -> JobState:
        """The job's state now."""

    def progress(self):
        """How far the job has got (launcher.rundir.metrics.Progress: step, total, steps_per_second,
        eta_seconds, metrics, rank_step_seconds), from its ctx.report calls; None before the first."""
        from ..rundir.metrics import progress

        return None if self.run is None else progress(self.run.path)

    def goodput(self):
        """Where the wall time went (launcher.goodput.Goodput: seconds per category, steps_recomputed,
        goodput, rows()), from the run directory's records."""
        from ..goodput import goodput

        if self.run is None:
            raise UsageError(self.no_run_dir_message())
        return goodput(self.run.path)

    def no_run_dir_message(self) -> str:
        """Why this job has no run directory, so no records to read, and the fix."""
        return f"job {self.id} has no run directory that jaxlaunch knows.\n  fix: name its run directory (RUN_DIR) instead."

    def metrics(self, as_frame: bool = False):
        """Every report of rank 0: [{'step', 'time', **metrics}], oldest first (over restarts); with
        `as_frame=True` a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        from ..rundir.metrics import metrics

        rows = [] if self.run is None else metrics(self.run.path)
        if as_frame:
            import pandas

            return pandas.DataFrame(rows)
        return rows

    def done(self) -> bool:
        return self.state().final

    def wait(self, timeout: float | None = None, on_change=None) -> JobState:
        """Block until the job ends; its final state. TimeoutError after `timeout` seconds.
        `on_change(job, state)` is called with the first state and each change."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, last = FIRST_POLL, None
        while True:
            state = self.state()
            if state != last:
                if on_change is not None:
                    on_change(self, state)
                last, delay = state, FIRST_POLL
            if state.final:
                return state
            if state == JobState.UNKNOWN:
                raise UnknownJobError(self.unknown_message())
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {self.id} still {state} after {timeout} s")
                time.sleep(min(delay, left))
            else:
                time.sleep(delay)
            delay = min(delay * BACKOFF, MAX_POLL)

    def unknown_message(self) -> str:
        return f"job {self.id}: its {self.backend} backend does not know it"

    def exit_code(self) -> int:
        """The exit code `jaxlaunch run` / `submit --wait` give for the job's final state: the
        supervisor's own (128 + the signal that stopped it), else the state's."""
        state, status = self.state(), self.status()
        if status.state == state and isinstance(status.exit_code, int) and not isinstance(status.exit_code, bool):
            return status.exit_code
        return state.exit_code()

    def result(self, timeout: float | None = None):
        """What the entrypoint returned on rank 0, once the job has ended (waits for it). A job
        that did not complete raises JobFailedError with its state and root cause, even when
        rank 0 wrote its value before another rank failed."""
        from ..rundir.results import load_result

        state = self.wait(timeout)
        if state != JobState.COMPLETED or self.run is None or not self.run.result_file.exists():
            failure = self.failure()
            why = f": {failure['summary']}" if failure else ""
            raise JobFailedError(f"job {self.id} has no result (state {state}){why}", state.value, failure)
        return load_result(self.run)

    def failure(self) -> dict | None:
        """failure.json: the root cause of a failed, timed-out or cancelled job (None if none)."""
        return self.run.read_failure() if self.run is not None else None

    def failure_lines(self) -> list[str]:
        """The root cause in a few lines (what `jaxlaunch status` and `--wait` print)."""
        failure = self.failure()
        if failure is None:
            return []
        from ..supervisor.root_cause import summary_lines

        return summary_lines(failure, self.run.path)

    def rank_log(self, rank: int) -> Path:
        """Rank `rank`'s log file; UsageError for a rank the job does not have."""
        if self.run is None:
            raise UnknownJobError(f"job {self.id}: no run directory known, so no rank logs")
        try:
            processes = self.run.read_spec().num_processes
        except (OSError, ValueError):
            processes = None  # no readable spec.json: only the lower bound can be checked
        if rank < 0 or (processes is not None and rank >= processes):
            if processes is None:
                has, valid = "ranks numbered from 0", "0 and up"
            else:
                valid = "0" if processes == 1 else f"0 to {processes - 1}"
                has = f"{processes} rank{'s' if processes > 1 else ''}: {valid}"
            raise UsageError(f"--rank {rank}: job {self.id} has {has}.\n  fix: pass --rank N with N in {valid}.")
        return self.run.rank_log(rank)

    @abstractmethod
    def logs(self, rank: int | None = None) -> str:
        """Rank `rank`'s full log, or (None) the job's combined output ("" before there is any)."""

    def follow_logs(self, rank: int | None, write, poll_seconds: float = 0.5) -> None:
        """Print the log as it grows until the job has ended and the file stops growing."""
        raise UsageError(f"job {self.id}: its {self.backend} backend cannot follow logs (-f)")

    @abstractmethod
    def cancel(self) -> None:
        """Stop the job (its supervisor records CANCELLED)."""


class Backend(ABC):
    """Starts jobs and finds them again. Subclasses: local.LocalBackend, slurm.SlurmBackend."""

    name = ""

    @abstractmethod
    def start(self, spec, run_dir=None, files: dict[str, bytes] | None = None, **options) -> Job:
        """Start `spec` (a JobSpec) and return at once with its handle. `files` ({relative path:
        bytes}) are written into the run directory before the job starts (a function job's call)."""

    @abstractmethod
    def start_map(self, sweep, files: list[dict[str, bytes]], max_parallel: int | None = None) -> list[Job]:
        """Start every configuration of `sweep` (one per item of Executor.map), configuration i
        with `files[i]` in its run directory; the handles, in order."""

    @abstractmethod
    def start_sweep(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print):
        """Start every configuration of `sweep`; returns the sweep directory."""

    @abstractmethod
    def preview(self, spec_or_sweep, run_dir=None, max_parallel: int | None = None) -> str:
        """What starting it would do, as text (--dry-run); nothing is created or started."""

    @abstractmethod
    def find(self, job_id_or_run_dir, run: RunDirectory | None = None) -> Job:
        """A handle on an earlier job of this backend."""

    def allocation_here(self, env) -> "Allocation | None":
        """The in-job side, when this process runs inside one of this backend's jobs (None else)."""
        return None

    def states(self, jobs: list[Job]) -> dict[str, JobState]:
        """The state of many jobs, asking the backend as few times as it can (one call for all)."""
        return {job.id: job.state() for job in jobs}


class Allocation:
    """The in-job side of a backend: what a running job's supervisor needs from the place its job
    runs (submitit's JobEnvironment, torchelastic's agent). The supervisor is given one and never
    asks a scheduler itself. This base class is a machine of our own (a local run): the ranks
    reach the supervisor on 127.0.0.1, no node can be lost, and nothing is requeued.
    Slurm's: launcher/backends/slurm/allocation.py."""

    backend = "local"
    job_id: str | None = None   # the scheduler's id for the job, when it has one

    def control_host(self, env) -> str:
        """The address the supervisor's control channel binds to, which every rank can reach:
        JAXLAUNCH_CONTROL_HOST when set, else the allocation's own answer."""
        from ..environment import CONTROL_HOST_ENV

        return env.get(CONTROL_HOST_ENV) or self.default_control_host(env)

    def default_control_host(self, env) -> str:
        return "127.0.0.1"

    def failing_nodes(self, spec, run, echo) -> dict[str, str]:
        """{node: why} for the nodes that fail the spec's health check, before the first attempt."""
        return {}

    def lost_nodes(self) -> dict[str, str]:
        """{node: why} for the nodes the allocation lost under a failed attempt."""
        return {}

    def leave_nodes_behind(self, bad: dict[str, str], cause: str, failure: dict | None, attempt: int,
                           run, spec, echo) -> tuple[JobState, dict | None]:
        """Give the job its nodes back without `bad`: REQUEUED, or FAILED when it cannot."""
        raise NotImplementedError(f"the {self.backend} backend cannot replace nodes")

    def requeues_spent(self, run, spec, attempts: int, echo) -> dict | None:
        """When the job starts again in its run directory: the failure that ends it at once
        (requeued more often than the spec allows), else None."""
        return None

    def cancelled_outside(self) -> bool:
        """The scheduler is ending the job because somebody cancelled it there (not through
        `jaxlaunch cancel`, which writes an event the supervisor reads itself)."""
        return False

    def ended_by_preemption(self) -> bool:
        """The scheduler ended the ranks for a preemption before they could stop on a notice."""
        return False

    def after_notice(self, run, spec, sources: set[str], checkpointed: bool, echo
                     ) -> tuple[JobState, dict | None, str | None]:
        """The ranks stopped on a preemption notice (or were ended by one): the job's state, its
        failure record, and the cause of a requeue. A local run ends PREEMPTED, to resume with
        `run --resume`."""
        return JobState.PREEMPTED, None, None

    def finish(self, run, state: JobState, requeue_cause: str | None, echo) -> None:
        """After status.json has the final state: what the scheduler must be told (a cancel to
        record, a requeue to make)."""
