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

from ...errors import SchedulerError
from ..base import Plan
from . import scheduler
from . import index as job_index
from .submission import render_for_submission
from .render import ARRAY_OUTPUT, SCRIPT_NAME, render_array_script, sbatch_directives
from ...spec import JobSpec
from ...sweeps.directory import SweepDirectory, task_folder
from ...sweeps.plan import Sweep
from ...states import JobState



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


class SweepPlan(Plan):
    """`submit --dry-run` of a sweep: its configurations, then every job array's script, grouped
    and split at the cluster's MaxArraySize (asked once, here) as `submit_sweep` does."""

    def __init__(self, sweep: Sweep, run_dir=None, max_parallel: int | None = None):
        directory = SweepDirectory.preview(sweep, run_dir)
        super().__init__(sweep, directory.path, run_dir)
        self.sweep, self.limit = sweep, max_array_size()
        self.max_parallel = max_parallel or sweep.base.max_parallel
        self.arrays = render_arrays(sweep, directory, self.limit, self.max_parallel)

    def describe(self) -> str:
        return self.sweep.describe() + "\n" + "".join(text for _, text in self.arrays)


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
    for number, (plan, text) in enumerate(arrays):
        script = directory.path / f"array-{number}.sbatch"
        script.write_text(text)
        script.chmod(0o755)
        try:
            array_id = scheduler.submit(str(script))
        except SchedulerError as exc:
            for index in plan.indices:
                by_index[index][1].update_status(state=JobState.SUBMIT_FAILED.value, backend="slurm", error=str(exc),
                                                 ended=time.time())
            directory.update(arrays=submitted)
            raise
        for position, index in enumerate(plan.indices):
            task, run = by_index[index]
            job_id = f"{array_id}_{position}"
            task["job_id"] = job_id
            run.update_status(state=JobState.SUBMITTED.value, backend="slurm", job_id=job_id, script=str(run.path / SCRIPT_NAME),
                              log=str(directory.logs / ARRAY_OUTPUT.replace("%A", array_id).replace("%a", str(position))),
                              submitted=time.time())
            job_index.record_job(job_id, run.path)
        job_index.record_array(array_id, directory.path)
        submitted.append({"job_id": array_id, "script": str(script), "tasks": plan.indices})
        echo(f"array {array_id}: {len(plan.indices)} tasks ({plan.folders[0]} .. {plan.folders[-1]})")
    record["arrays"] = submitted
    record["tasks"] = [task for task, _ in runs]
    directory.update(**{k: record[k] for k in ("arrays", "tasks")})
    return [entry["job_id"] for entry in submitted]
