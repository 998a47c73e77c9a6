"""A sweep's progress, whatever ran it: one `TaskState` per configuration, the count per state
and the one-line summary that `jaxlaunch status` and `--wait` print. A backend says each task's
state (`Backend.sweep_states`); a task read from its own status.json alone is `state_from_run`'s
(a local sweep's tasks, and a Slurm task its scheduler has forgotten)."""

from __future__ import annotations

from dataclasses import dataclass

from ..rundir import RunDirectory
from ..states import StatusRecord
from .directory import SweepDirectory


@dataclass(frozen=True)
class TaskState:
    index: int
    folder: str
    job_id: str          # the backend's id for the task ("" when it has none: a local task)
    state: str           # a JobState's value, or the backend's word for it ('RUNNING', 'X (no longer known ...)')
    elapsed: str         # H:MM:SS, or "" before it started
    values: dict         # the swept keys' values
    run: RunDirectory
    finished: bool = False  # it will not change any more


def elapsed(status: StatusRecord) -> str:
    """H:MM:SS between status.json's started and ended ("" unless both are there)."""
    if status.started and status.ended:
        seconds = int(status.ended - status.started)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return ""


def state_from_run(task: dict, run: RunDirectory, status: StatusRecord | None = None) -> TaskState:
    """A task's state as its own status.json has it (`task`: its entry in sweep.json)."""
    status = run.status() if status is None else status
    return TaskState(task["index"], task["folder"], task.get("job_id", ""), status.state.value, elapsed(status),
                     task["values"], run, status.state.final)


def states_from_runs(directory: SweepDirectory) -> list[TaskState]:
    """Every task's state from its status.json alone (no scheduler call)."""
    return [state_from_run(task, run) for task, run in directory.task_runs()]


def count_states(states: list[TaskState]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task in states:
        counts[task.state] = counts.get(task.state, 0) + 1
    return counts


def summary_line(directory: SweepDirectory, states: list[TaskState]) -> str:
    """'sweep DIR (5 tasks; arrays 101, 102): 1 CANCELLED, 2 COMPLETED, ...'."""
    counts = ", ".join(f"{n} {state}" for state, n in sorted(count_states(states).items()))
    arrays = ", ".join(entry["job_id"] for entry in directory.read().get("arrays", []))
    return f"sweep {directory.path} ({len(states)} tasks{'; arrays ' + arrays if arrays else ''}): {counts}"


def all_finished(states: list[TaskState]) -> bool:
    return all(task.finished for task in states)
