"""`jaxlaunch submit` with a sweep: Slurm job arrays, and their status.

Tasks that need the same resources (the same #SBATCH lines) go into one array; a sweep of
`nodes` needs one array per node count. An array longer than the cluster's MaxArraySize is split
into several, each with its own list of task folders (an offset into the sweep). Array task i of
an array runs the complete batch script of its sweep task, so each task is exactly the job a
single `jaxlaunch submit` would have run: its own run directory, supervisor, requeues and result.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import SchedulerError
from ..rundir import FINAL_STATES, RunDirectory, atomic_write_json
from ..slurm import scheduler
from ..slurm.jobs import jobs_index, render_for_submission
from ..slurm.render import ARRAY_OUTPUT, SCRIPT_NAME, render_array_script, sbatch_directives
from ..spec import JobSpec
from .directory import SweepDirectory, task_folder
from .plan import Sweep



def max_array_size() -> int:
    """The cluster's MaxArraySize (array indices go up to it minus one); Slurm's default 1001."""
    out = scheduler.call_slurm(["scontrol", "show", "config"])
    match = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(match.group(1)) if match else 1001


@dataclass(frozen=True)
class ArrayPlan:
    spec: JobSpec          # the first task's spec: its #SBATCH lines are every task's
    indices: list[int]     # sweep task indices, in array order
    folders: list[str]


def plan_arrays(sweep: Sweep, folders: dict[int, str], limit: int, workdir: Path) -> list[ArrayPlan]:
    """Pure: group the configurations by their #SBATCH lines, then split groups longer than `limit`."""
    groups: dict[tuple, list] = {}
    for configuration in sweep.configurations:
        key = tuple(sbatch_directives(configuration.spec, Path("/sweep"), workdir, output=Path("/sweep/out")))
        groups.setdefault(key, []).append(configuration)
    plans = []
    for members in groups.values():
        for start in range(0, len(members), limit):
            chunk = members[start:start + limit]
            plans.append(ArrayPlan(chunk[0].spec, [c.index for c in chunk], [folders[c.index] for c in chunk]))
    return plans


def render_arrays(sweep: Sweep, directory: SweepDirectory, limit: int, max_parallel: int | None) -> list[tuple[ArrayPlan, str]]:
    folders = {c.index: task_folder(c.index, len(sweep.configurations)) for c in sweep.configurations}
    plans = plan_arrays(sweep, folders, limit, Path.cwd())
    return [(plan, render_array_script(plan.spec, directory.path, plan.folders, Path.cwd(), max_parallel,
                                       first_index=plan.indices[0])) for plan in plans]


def submit_sweep(sweep: Sweep, directory: SweepDirectory, max_parallel: int | None, echo=print) -> list[str]:
    """Write every task's batch script and each array's, sbatch the arrays; returns their job ids.
    If sbatch refuses an array, its tasks are marked SUBMIT_FAILED and the error propagates
    (arrays submitted before it keep running: `jaxlaunch cancel` them if need be)."""
    specs = {c.index: c.spec for c in sweep.configurations}
    runs = directory.task_runs()
    for task, run in runs:
        script = run.path / SCRIPT_NAME
        script.write_text(render_for_submission(specs[task["index"]], run.path))
        script.chmod(0o755)
    arrays = render_arrays(sweep, directory, max_array_size(), max_parallel)
    by_index = {task["index"]: (task, run) for task, run in runs}
    record = directory.read()
    submitted = []
    index_folder = jobs_index()
    index_folder.mkdir(parents=True, exist_ok=True)
    for number, (plan, text) in enumerate(arrays):
        script = directory.path / f"array-{number}.sbatch"
        script.write_text(text)
        script.chmod(0o755)
        try:
            array_id = scheduler.submit(str(script))
        except SchedulerError as exc:
            for index in plan.indices:
                by_index[index][1].update_status(state="SUBMIT_FAILED", backend="slurm", error=str(exc),
                                                 ended=time.time())
            directory.update(arrays=submitted)
            raise
        for position, index in enumerate(plan.indices):
            task, run = by_index[index]
            job_id = f"{array_id}_{position}"
            task["job_id"] = job_id
            run.update_status(state="SUBMITTED", backend="slurm", job_id=job_id, script=str(run.path / SCRIPT_NAME),
                              log=str(directory.logs / ARRAY_OUTPUT.replace("%A", array_id).replace("%a", str(position))),
                              submitted=time.time())
            atomic_write_json(index_folder / f"{job_id}.json", {"job_id": job_id, "run_dir": str(run.path)})
        atomic_write_json(index_folder / f"{array_id}.json", {"job_id": array_id, "sweep_dir": str(directory.path)})
        submitted.append({"job_id": array_id, "script": str(script), "tasks": plan.indices})
        echo(f"array {array_id}: {len(plan.indices)} tasks ({plan.folders[0]} .. {plan.folders[-1]})")
    record["arrays"] = submitted
    record["tasks"] = [task for task, _ in runs]
    directory.update(**{k: record[k] for k in ("arrays", "tasks")})
    return [entry["job_id"] for entry in submitted]


def sweep_dir_of(job_id: str) -> SweepDirectory | None:
    """The sweep directory of an array id that jaxlaunch submitted, else None."""
    import json

    entry = jobs_index() / f"{job_id}.json"
    try:
        record = json.loads(entry.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return SweepDirectory(record["sweep_dir"]) if "sweep_dir" in record else None


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


def _elapsed(status: dict) -> str:
    if status.get("started") and status.get("ended"):
        seconds = int(status["ended"] - status["started"])
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return ""


def task_states(directory: SweepDirectory) -> list[TaskState]:
    """Every task's state: Slurm's while it knows the task, the task's own status.json after
    (the supervisor writes why a task ended: TIMEOUT, FAILED with its root cause...)."""
    record = directory.read()
    live = _squeue_states([entry["job_id"] for entry in record.get("arrays", [])])
    states = []
    for task, run in directory.task_runs(record):
        status = run.read_status()
        job_id = task.get("job_id", "")
        own = status.get("state", "PENDING")
        if job_id in live:
            state, finished = scheduler.translate_state(live[job_id][0])
            if finished and own in FINAL_STATES:
                state = own
            elapsed = live[job_id][1]
        elif record.get("backend") == "slurm" and own not in FINAL_STATES and job_id:
            info = scheduler.query_job(job_id)  # purged from squeue: scontrol or sacct may know it
            state, elapsed = (info.state, info.elapsed) if info else (f"{own} (no longer known to Slurm)", "")
        else:
            state, elapsed = own, _elapsed(status)
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
    return all(scheduler.translate_state(task.state.split()[0])[1] or task.state in FINAL_STATES
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
