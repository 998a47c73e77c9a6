"""A sweep's progress: every task's state (Slurm's while it knows the task, then the task's own
status.json), the count per state, and `--wait` for the whole sweep. Local and Slurm sweeps alike."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...errors import SchedulerError
from ...rundir import RunDirectory
from . import scheduler
from ...states import JobState, StatusRecord
from ...sweeps.directory import SweepDirectory


@dataclass(frozen=True)
class TaskState:
    index: int
    folder: str
    job_id: str
    state: str
    elapsed: str
    values: dict
    run: RunDirectory


def _squeue_states(array_ids: list[str]) -> dict[str, tuple[str, str]]:
    """'A_i' -> (Slurm state, elapsed) for every task Slurm still lists (-r: one line per task)."""
    if not array_ids:
        return {}
    try:
        out = scheduler.call_slurm(["squeue", "-r", "--noheader", "--states=all", "--jobs", ",".join(array_ids),
                                    "--format=%i|%T|%M"])
    except SchedulerError as exc:
        if "Invalid job id" in exc.stderr:
            return {}
        raise
    states = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 3:
            states[fields[0]] = (fields[1], fields[2])
    return states


def _elapsed(status: StatusRecord) -> str:
    if status.started and status.ended:
        seconds = int(status.ended - status.started)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return ""


def task_states(directory: SweepDirectory) -> list[TaskState]:
    """Every task's state: Slurm's while it knows the task, the task's own status.json after
    (the supervisor writes why a task ended: TIMEOUT, FAILED with its root cause...). A local
    sweep's tasks answer from status.json alone. At most three scheduler calls for the lot."""
    record = directory.read()
    runs = directory.task_runs(record)
    statuses = [run.status() for _, run in runs]
    live = _squeue_states([entry["job_id"] for entry in record.get("arrays", [])])
    purged = [task.get("job_id", "") for (task, _), status in zip(runs, statuses)
              if record.get("backend") == "slurm" and task.get("job_id") and task["job_id"] not in live
              and not status.state.final]
    forgotten = scheduler.query_jobs(purged) if purged else {}  # scontrol or sacct may still know them
    states = []
    for (task, run), status in zip(runs, statuses):
        job_id = task.get("job_id", "")
        own = status.state
        if job_id in live:
            state, finished = scheduler.translate_state(live[job_id][0])
            if finished and own.final:
                state = own.value
            elapsed = live[job_id][1]
        elif job_id in purged:
            info = forgotten.get(job_id)
            state, elapsed = (info.state, info.elapsed) if info else (f"{own} (no longer known to Slurm)", "")
        else:
            state, elapsed = own.value, _elapsed(status)
        states.append(TaskState(task["index"], task["folder"], job_id, state, elapsed, task["values"], run))
    return states


def count_states(states: list[TaskState]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for task in states:
        counts[task.state] = counts.get(task.state, 0) + 1
    return counts


def summary_line(directory: SweepDirectory, states: list[TaskState]) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(count_states(states).items()))
    arrays = ", ".join(entry["job_id"] for entry in directory.read().get("arrays", []))
    return f"sweep {directory.path} ({len(states)} tasks{'; arrays ' + arrays if arrays else ''}): {counts}"


def all_finished(states: list[TaskState]) -> bool:
    return all(scheduler.translate_state(task.state.split()[0])[1] or JobState.parse(task.state).final
               or "no longer known" in task.state for task in states)


def wait_for_sweep(directory: SweepDirectory, echo, poll_seconds: float = 2.0) -> list[TaskState]:
    """Follow every task to its end, echoing the counts whenever they change."""
    last = None
    while True:
        states = task_states(directory)
        line = summary_line(directory, states)
        if line != last:
            echo(line)
            last = line
        if all_finished(states):
            return states
        time.sleep(poll_seconds)
