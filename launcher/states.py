"""Job states and the status record: the words every backend, the supervisor, the CLI and the API
share.

`JobState` is a `str` enum, so a state compares equal to its name ("COMPLETED") and status.json
stays plain JSON. It knows whether it is final and which exit code `jaxlaunch run`, `submit --wait`
and the API's callers get for it: one table for all of them.

`StatusRecord` is status.json: one typed record with a schema version, written only through
`RunDirectory.update_status`, which refuses a field the record does not have.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from enum import Enum

# Exit codes: 124 as coreutils' `timeout`; 75 is EX_TEMPFAIL (sysexits.h, "try again later"): the
# job checkpointed and stopped on a preemption notice and `jaxlaunch run --resume` continues it.
EXIT_COMPLETED, EXIT_FAILED, EXIT_TIMEOUT, EXIT_PREEMPTED = 0, 1, 124, 75


class JobState(str, Enum):
    PENDING = "PENDING"            # waiting: in Slurm's queue, or not started yet
    SUBMITTED = "SUBMITTED"        # sbatch took it; nothing has been heard from it since
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"          # its supervisor put the Slurm job back in the queue; it runs again
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"            # the spec's timeout, Slurm's time limit, or a collective that hung
    CANCELLED = "CANCELLED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"        # checkpointed and stopped on a notice (a local run; resume it)
    SUBMIT_FAILED = "SUBMIT_FAILED"  # sbatch refused it
    UNKNOWN = "UNKNOWN"            # a Slurm state this table does not know

    def __str__(self) -> str:
        return self.value

    @property
    def final(self) -> bool:
        return self in _FINAL

    def exit_code(self, stop_signal: int | None = None) -> int:
        """The exit code for a job that ended in this state (128 + the signal for CANCELLED,
        SIGTERM when no signal is known, as a shell reports a killed process)."""
        if self is JobState.CANCELLED:
            return 128 + int(stop_signal or signal.SIGTERM)
        return _EXIT_CODES.get(self, EXIT_FAILED)

    @classmethod
    def parse(cls, text) -> "JobState":
        """The state named by `text` ("COMPLETED", a JobState); UNKNOWN for anything else."""
        try:
            return cls(str(text))
        except ValueError:
            return cls.UNKNOWN


class Cause(str, Enum):
    """Why an attempt ended, when it did not complete: failure.json's `reason`, the supervisor's stop,
    the governor's classes (supervisor/governor.py) and the causes of requeues and spare swaps. Like
    JobState, it compares equal to its word ("hang"), so the records stay plain JSON."""

    EXCEPTION = "exception"                # the program's own: an exception,
    EXIT = "exit"                          # a non-zero exit,
    HANG = "hang"                          # a hang the watchdog stopped
    COLLECTIVE_TIMEOUT = "collective_timeout"  # a launcher collective waited past collective_timeout
    LEFT_EARLY = "left_early"              # a rank left its entrypoint while others waited in a collective
    FAILED = "failed"                      # a rank failed, kind unknown
    TIMEOUT = "timeout"                    # the spec's timeout, or the scheduler's time limit
    CANCELLED = "cancelled"                # a person (or a signal from outside) stopped it
    PREEMPTION = "preemption"              # the machine's: a preemption notice,
    NODE_FAILURE = "node_failure"          # a node lost,
    HEALTH_CHECK = "health_check"          # a node failed slurm.health_check
    REQUEUE_LIMIT = "requeue_limit"        # slurm.max_requeues spent

    def __str__(self) -> str:
        return self.value


# What a node did, for "node(s) ... (node2: ...)" lines of a requeue or spare swap.
NODE_CAUSE_WORDS = {Cause.HEALTH_CHECK: "failed the health check", Cause.HANG: "held the job up in a hang",
                    Cause.NODE_FAILURE: "failed under the job"}


_FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED,
                    JobState.OUT_OF_MEMORY, JobState.PREEMPTED, JobState.SUBMIT_FAILED})
_EXIT_CODES = {JobState.COMPLETED: EXIT_COMPLETED, JobState.REQUEUED: EXIT_COMPLETED,
               JobState.TIMEOUT: EXIT_TIMEOUT, JobState.PREEMPTED: EXIT_PREEMPTED}
FINAL_STATES = tuple(sorted(s.value for s in _FINAL))

STATUS_VERSION = 1


@dataclass
class StatusRecord:
    """status.json. Times are seconds since the epoch; counts start at 0."""

    state: JobState = JobState.PENDING
    backend: str | None = None        # "local" or "slurm"
    job_id: str | None = None         # Slurm's id (an array task's: 123_4)
    exit_code: int | str | None = None  # ours, or Slurm's "0:15" for a job its supervisor never ended
    reason: str | None = None         # why it ended, in a line (the root cause's summary)
    error: str | None = None          # sbatch's refusal, for SUBMIT_FAILED
    slurm_state: str | None = None    # Slurm's own word, when Slurm decided the state
    command: list | None = None       # the launcher's argv (a local run)
    script: str | None = None         # the batch script (a Slurm job)
    log: str | None = None            # the combined output, where it is not RUN_DIR/slurm-ID.out
    submitted: float | None = None
    started: float | None = None
    attempt_started: float | None = None
    ended: float | None = None
    attempts: int = 0                 # attempts started in this run directory (ctx.attempt + 1)
    restarts: int = 0                 # restarts after a failure in the latest launch (max_restarts)
    requeues: int = 0                 # Slurm requeues so far, and why
    preemptions: int = 0
    timeouts: int = 0
    node_failures: int = 0            # requeues that left bad nodes behind (failed, or failed the health check)
    hang_requeues: int = 0            # requeues after a hang, without the node of the rank that held the job up
    excluded_nodes: list | None = None  # the nodes this job excludes from its requeues
    # slurm.spare_nodes: the nodes the job stopped using inside its allocation ({node: why}), and
    # each swap ({cause, nodes, spares, attempt}), newest last
    replaced_nodes: dict | None = None
    spare_swaps: list | None = None
    # rank -> seconds since its main thread's stack moved (or it reported), as of still_at: the
    # hang watchdog's view, written by the supervisor while the job runs
    still: dict | None = None
    still_at: float | None = None
    supervisor_pid: int | None = None   # a local run's supervisor: pid, its start time, the host
    supervisor_start: int | None = None
    supervisor_host: str | None = None
    version: int = STATUS_VERSION

    def __post_init__(self):
        self.state = JobState.parse(self.state)

    @classmethod
    def from_dict(cls, data: dict) -> "StatusRecord":
        """A record from status.json's content; keys a newer jaxlaunch added are ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        record = dataclasses.asdict(self)
        record["state"] = self.state.value
        return record

    def updated(self, **fields) -> "StatusRecord":
        """A copy with `fields` changed; TypeError for a field status.json does not have."""
        unknown = set(fields) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"status.json has no field {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **fields)


# The event (events.jsonl) that `jaxlaunch cancel` appends before it signals a Slurm job: its
# supervisor reads it to tell the cancel's SIGTERM from a preemption's, which looks the same.
CANCEL_EVENT = "cancel_requested"

__all__ = ["CANCEL_EVENT", "JobState", "StatusRecord", "FINAL_STATES", "EXIT_COMPLETED", "EXIT_FAILED", "EXIT_TIMEOUT",
           "EXIT_PREEMPTED", "STATUS_VERSION"]
