"""Backends: where a job runs. Each one starts jobs (or sweeps of jobs), finds them again by id or
run directory, asks for the state of many at once, cancels them and reads their logs, and hands
out one kind of `Job` handle with the same methods (base.py). The CLI and the Python API
(launcher.run/submit/job) use the same handles.

    local.py   mpirun on this machine; the job's supervisor runs here
    slurm.py   sbatch on a Slurm cluster; the supervisor runs inside the batch job

A new backend (another scheduler, a function executor) is one new module here that subclasses
`Backend` and `Job`, plus a line in `BACKENDS`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .base import Allocation, Backend, Job

BACKENDS = {"local": "launcher.backends.local:LocalBackend", "slurm": "launcher.backends.slurm:SlurmBackend"}


def get_backend(name: str) -> Backend:
    """The backend called `name` ("local" or "slurm"); imported on first use (start-up time)."""
    import importlib

    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; jaxlaunch has {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def is_job_id(text: str) -> bool:
    """A Slurm job id (123) or array task id (123_4)."""
    head, _, task = text.partition("_")
    return head.isdigit() and (task.isdigit() or not _)


def find_job(job_id_or_run_dir) -> Job:
    """A handle on an earlier job: a Slurm job id, or a run directory (of a local run, or of a
    Slurm job: its status.json names the backend)."""
    text = str(job_id_or_run_dir)
    if is_job_id(text):
        return get_backend("slurm").find(text)
    folder = Path(text)
    if not (folder / "spec.json").exists():
        raise UsageError(f"{text} is neither a Slurm job id nor a run directory (no spec.json there)")
    from ..rundir import RunDirectory

    status = RunDirectory(folder).status()
    if status.backend == "slurm" and status.job_id:
        return get_backend("slurm").find(status.job_id, RunDirectory(folder))
    return get_backend("local").find(folder)


__all__ = ["Allocation", "Backend", "Job", "BACKENDS", "get_backend", "find_job", "is_job_id"]
