"""Backends: where a job runs. Each one plans and starts jobs (or sweeps of jobs), finds them
again by id or run directory, asks for the state of many at once, cancels them and reads their
logs, and hands out one kind of `Job` handle with the same methods (base.py: the seam). The CLI,
the status tables, doctor, explain and the Python API (launcher.run/submit/job) reach a backend
only through this file: `get_backend(name)` and `find_job(ref)`.

    local/     mpirun on this machine; the job's supervisor runs here
    slurm/     sbatch on a Slurm cluster; the supervisor runs inside the batch job

How ranks start (mpirun, srun) is launcher/launchers/, which both use; what a backend answers is
records.py's records (the CLI words them: launcher/cli/job_views.py).

Backends come from a registry, read when first needed: the entry-point group `jaxlaunch.backends`
(as torchx's `torchx.schedulers` and submitit's executors; jaxlaunch's own two are declared there in
pyproject.toml, and kept here too, for a checkout that pip never installed), then JAXLAUNCH_BACKENDS
(`NAME=module:Class`, comma-separated: a backend not packaged yet, the test suite's fake). A new backend
(another scheduler, a function executor) is one package whose `Backend` subclass an entry point names;
nothing in jaxlaunch changes.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from ..errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .base import Backend, Job


def __getattr__(name):
    """The seam's classes, imported when first asked for: the CLI reads this package's names and
    defaults when it starts, and base.py's imports would cost every command ~30 ms."""
    if name in ("Allocation", "Backend", "Job"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ENTRY_POINT_GROUP = "jaxlaunch.backends"
EXTRA_BACKENDS_ENV = "JAXLAUNCH_BACKENDS"
BUILT_IN = {"local": "launcher.backends.local:LocalBackend", "slurm": "launcher.backends.slurm:SlurmBackend"}
# The defaults: `run` and `explain` start ranks on this machine, `submit` hands the job to Slurm.
RUN_DEFAULT, SUBMIT_DEFAULT = "local", "slurm"


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str], ...]:
    """The entry points of the group (read once per process: ~10 ms on a venv's metadata)."""
    from importlib.metadata import entry_points

    return tuple((point.name, point.value) for point in entry_points(group=ENTRY_POINT_GROUP))


def registry() -> dict[str, str]:
    """Backend name -> 'module:Class', in order: the built-in two, the installed ones, then
    JAXLAUNCH_BACKENDS. A name given twice keeps its first target."""
    found = dict(BUILT_IN)
    for name, target in _installed():
        found.setdefault(name, target)
    for item in os.environ.get(EXTRA_BACKENDS_ENV, "").split(","):
        name, sep, target = item.strip().partition("=")
        if sep and name.strip() and ":" in target:
            found.setdefault(name.strip(), target.strip())
    return found


def names() -> list[str]:
    return list(registry())


def get_backend(name: str) -> Backend:
    """The backend called `name` (a name in the registry); imported on first use (start-up time)."""
    import importlib

    known = registry()
    if name not in known:
        raise UsageError(f"unknown backend {name!r}; jaxlaunch has {', '.join(known)}"
                         f" (others: an entry point in the group {ENTRY_POINT_GROUP!r}, or {EXTRA_BACKENDS_ENV})")
    module, _, cls = known[name].partition(":")
    try:
        found = getattr(importlib.import_module(module), cls)
    except Exception as error:  # a third-party module may raise anything while it imports
        reason = error if isinstance(error, (ImportError, AttributeError)) else f"{type(error).__name__}: {error}"
        raise UsageError(f"backend {name!r} ({known[name]}) cannot be loaded: {reason}\n  fix: install the package "
                         f"that provides it, or correct its entry point or {EXTRA_BACKENDS_ENV}") from None
    return found()


_warned_unloadable: set[str] = set()


def all_backends() -> list[Backend]:
    """One of each backend that loads, in the registry's order (the order of `jaxlaunch status`
    and doctor). One that cannot load is skipped with a warning, once per process: a broken
    third-party entry point must not stop `status`, `cancel` or `logs` of a local or Slurm job;
    get_backend(name) still raises for it, where it is asked for by name."""
    loaded = []
    for name in registry():
        try:
            loaded.append(get_backend(name))
        except UsageError as error:
            if name not in _warned_unloadable:
                _warned_unloadable.add(name)
                print(f"jaxlaunch: warning: {str(error).splitlines()[0]} (skipped)", file=sys.stderr)
    return loaded


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
    if status.backend in registry() and status.job_id:
        return get_backend(status.backend).find(status.job_id, run)
    return get_backend(RUN_DEFAULT).find(Path(text))


__all__ = ["Allocation", "Backend", "Job", "ENTRY_POINT_GROUP", "EXTRA_BACKENDS_ENV", "RUN_DEFAULT", "SUBMIT_DEFAULT",
           "registry", "names", "get_backend", "all_backends", "claimant", "id_words", "find_job"]
