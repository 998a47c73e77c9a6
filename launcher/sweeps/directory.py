"""The sweep directory: one folder per sweep, one ordinary run directory per configuration.

    sweep.json          the sweep: its spec, swept keys, and every task's values (and, on Slurm,
                        its job id and the arrays)
    task-000/ ...       each configuration's run directory (spec.json, logs/, status.json,
                        result.json: see launcher/rundir/__init__.py)
    logs/               Slurm's output of each array task (slurm-%A_%a.out)
    array-K.sbatch      the script of Slurm job array K
    results.csv/.json   what `jaxlaunch results` collected last
    output.log          what the runner of a local sweep printed itself (launcher/backends/local/array.py)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import UsageError
from ..rundir import RUNS_ROOT, RunDirectory, atomic_write_json, make_private_dir
from ..rundir.names import OUTPUT_LOG
from .plan import Sweep

SWEEP_FILE = "sweep.json"
RESULTS_CSV = "results.csv"    # what `jaxlaunch results` collected last, as a table
RESULTS_JSON = "results.json"  # the same as data


def task_folder(index: int, total: int) -> str:
    """task-007: zero-padded, so folders sort in sweep order."""
    return f"task-{index:0{max(3, len(str(total - 1)))}d}"


class SweepDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()

    sweep_file = property(lambda self: self.path / SWEEP_FILE)
    results_csv = property(lambda self: self.path / RESULTS_CSV)
    results_json = property(lambda self: self.path / RESULTS_JSON)
    output_log = property(lambda self: self.path / OUTPUT_LOG)  # a local sweep's runner's own output
    logs = property(lambda self: self.path / "logs")

    @staticmethod
    def holds_a_sweep(path: str | Path) -> bool:
        """Whether `path` is a sweep directory (it holds sweep.json)."""
        return (Path(path) / SWEEP_FILE).is_file()

    @staticmethod
    def template(sweep: Sweep, path: str | Path | None) -> str:
        return str(path) if path is not None else sweep.base.run_dir or f"{RUNS_ROOT}/{{name}}-sweep-{{time}}"

    @classmethod
    def preview(cls, sweep: Sweep, path: str | Path | None = None) -> "SweepDirectory":
        return cls(RunDirectory.expand(cls.template(sweep, path), sweep.base, time.strftime("%Y%m%d-%H%M%S")))

    @classmethod
    def create(cls, sweep: Sweep, path: str | Path | None, backend: str) -> "SweepDirectory":
        """Make the sweep directory, every task's run directory (with its spec.json) and sweep.json.
        An existing directory is accepted only if empty, so no sweep overwrites another's results."""
        target = cls.preview(sweep, path).path
        make_private_dir(target)
        if any(target.iterdir()):
            raise UsageError(f"sweep directory {target} already holds files; choose a new or empty one")
        directory = cls(target)
        tasks = []
        for configuration in sweep.configurations:
            folder = task_folder(configuration.index, len(sweep.configurations))
            RunDirectory.create(configuration.spec, target / folder)
            tasks.append({"index": configuration.index, "folder": folder, "values": configuration.values})
        directory.logs.mkdir(exist_ok=True)
        atomic_write_json(directory.sweep_file, {
            "version": 1, "name": sweep.name, "spec": str(sweep.spec_path.resolve()), "keys": sweep.keys,
            "backend": backend, "created": time.time(), "tasks": tasks})
        return directory

    def read(self) -> dict:
        """sweep.json, checked (UsageError with the fix if it is missing or broken)."""
        return read_sweep(self.path)

    def update(self, **fields) -> dict:
        record = {**self.read(), **fields}
        atomic_write_json(self.sweep_file, record)
        return record

    def task_runs(self, record: dict | None = None) -> list[tuple[dict, RunDirectory]]:
        """(task entry of sweep.json, its run directory), in index order."""
        record = record or self.read()
        return [(task, RunDirectory(self.path / task["folder"])) for task in record["tasks"]]


def read_sweep(sweep_dir) -> dict:
    """sweep.json as a dict, with `keys` and `tasks` checked; UsageError if it is missing or broken."""
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        sweep = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE}).\n"
                         f"  fix: pass the folder that `jaxlaunch run` or `jaxlaunch submit` with --sweep printed, "
                         f"the one holding {SWEEP_FILE} and task-000/, task-001/, ...") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read: {exc}.\n"
                         f"  fix: it is written by jaxlaunch when the sweep starts; if it was edited by hand, "
                         f"restore it (it lists the swept keys and one entry per task).") from None
    tasks = sweep.get("tasks") if isinstance(sweep, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise UsageError(f"{path} has no list of tasks.\n"
                         f"  fix: it is written by jaxlaunch when the sweep starts; if it was edited by hand, "
                         f"restore it (\"tasks\": [{{\"index\": 0, \"folder\": \"task-000\", \"values\": ...}}]).")
    keys = sweep.get("keys")
    if not isinstance(keys, list):  # older or hand-written files: the keys of the first task, in order
        keys = list(tasks[0].get("values", {})) if tasks else []
    return {**sweep, "keys": [str(k) for k in keys], "tasks": tasks}
