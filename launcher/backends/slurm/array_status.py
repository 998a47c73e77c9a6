"""A Slurm sweep's progress: every task's state (Slurm's while it knows the task, then the task's
own status.json). The counts, the summary line and `--wait` are every backend's
(launcher/sweeps/tasks.py, Backend.wait_for_sweep)."""

from __future__ import annotations

from ...errors import SchedulerError
from . import scheduler
from ...states import JobState
from ...sweeps.directory import SweepDirectory
from ...sweeps.tasks import TaskState, all_finished, count_states, elapsed, summary_line

__all__ = ["task_states", "TaskState", "all_finished", "count_states", "summary_line"]


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
            shown = live[job_id][1]
        elif job_id in purged:
            info = forgotten.get(job_id)
            state, shown = (info.state, info.elapsed) if info else (f"{own} (no longer known to Slurm)", "")
        else:
            state, shown = own.value, elapsed(status)
        finished = (scheduler.translate_state(state.split()[0])[1] or JobState.parse(state).final
                    or "no longer known" in state)
        states.append(TaskState(task["index"], task["folder"], job_id, state, shown, task["values"], run, finished))
    return states
