"""Backends: where a job runs. Each one plans and starts jobs (or sweeps of jobs), finds them
again by id or run directory, asks for the state of many at once, cancels them and reads their
logs, and hands out one kind of `Job` handle with the same methods (base.py: the seam). The CLI,
the status tables, doctor, explain and the Python API (launcher.run/submit/job) reach a backend
only through this file: `get_backend(name)` and `find_job(ref)`.

    local/     mpirun on this machine; the job's supervisor runs here
    slurm/     sbatch on a Slurm cluster; the supervisor runs inside the batch job
    mpirun.py  how ranks start under mpirun (the local backend's, and a batch script's)

A new backend (another scheduler, a function executor) is one new package here whose __init__
exports its `Backend` and `Job` subclasses, plus a line in `BACKENDS`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .base import Allocation, Backend, Job

BACKENDS = {"local": "launcher.backends.local:LocalBackend", "slurm": "launcher.backends.slurm:SlurmBackend"}


def get_backend(name: str) -> Backend:
    """The backend called `name` (a key of BACKENDS); imported on first use (start-up time)."""
    import importlib

    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}; jaxlaunch has {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()


def all_backends() -> list[Backend]:
    """One of each backend, in BACKENDS' order (the order of `jaxlaunch status` and doctor)."""
    return [get_backend(name) for name in BACKENDS]


def claimant(ref: str) -> Backend | None:
    """The backend whose job id `ref` is (Backend.claims: from the text alone), None for none."""
    return next((backend for backend in all_backends() if backend.claims(str(ref))), None)


def id_words() -> str:
    """What a job id may be, for messages: "a Slurm job id (a number, e.g. 12345, ...)"."""
    return " or ".join(f"{b.id_name} ({b.id_example})" if b.id_example else b.id_name
                       for b in all_backends() if b.id_name)


def find_job(job_id_or_run_dir, to_cancel: bool = False) -> Job:
    """A handle on an earlier job: a job id that a backend claims, or a run directory (its
    status.json names the backend, and the scheduler's id for the job when it has one; without
    one, the run is read from its folder alone, as a local run). `to_cancel`: the handle
    `jaxlaunch cancel` cancels (Backend.find_to_cancel: a Slurm array id stands for its tasks)."""
    text = str(job_id_or_run_dir)
    backend = claimant(text)
    if backend is not None:
        return backend.find_to_cancel(text) if to_cancel else backend.find(text)
    from ..rundir import RunDirectory

    run = RunDirectory(text)
    if not run.spec_file.exists():
        names = " nor ".join(b.id_name for b in all_backends() if b.id_name)
        raise UsageError(f"{text} is neither {names + ' nor ' if names else ''}a run directory "
                         f"(no {run.spec_file.name} there)")
    status = run.status()
    if status.backend in BACKENDS and status.job_id:
        return get_backend(status.backend).find(status.job_id, run)
    return get_backend("local").find(Path(text))


__all__ = ["Allocation", "Backend", "Job", "BACKENDS", "get_backend", "all_backends", "claimant", "id_words",
           "find_job"]
