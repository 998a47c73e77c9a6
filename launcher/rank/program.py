"""What a rank runs: the spec's entrypoint, of one of four kinds (launcher/spec/model.py).

- A function (`file.py:main`, `pkg.module:main`) is imported and called with the JobContext;
  its return value on rank 0 is the job's result.
- A program (a script `train.py`, a module `pkg.train` or `pytest`) runs as `__main__`, as
  `python FILE ARGS` or `python -m MODULE ARGS` would run it, with the spec's `args` as its
  sys.argv[1:]. It runs in the rank process, after jaxlaunch has bound the devices and started
  MPI, so supervision (logs, fail-fast, stacks, progress, restarts) is the same as a function's.

Either way, sys.exit(0) (or None) ends the entrypoint successfully; any other exit code is the
rank's failure with that code (bootstrap.py turns the SystemExit into the rank's exit).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import sys
from pathlib import Path

JOB_MODULE_PREFIX = "jaxlaunch_job_"  # job files are imported as modules named jaxlaunch_job_<stem>


def load_entrypoint(entrypoint: str, code: Path | None = None):
    """The function named by 'pkg.module:function' or '/abs/path/file.py:function'. `code`: the
    run's snapshot of the job's code (spec key snapshot), searched first for modules."""
    target, _, function = entrypoint.rpartition(":")
    if code is not None:
        sys.path.insert(0, str(code))
    if target.endswith(".py"):
        path = Path(target)
        sys.path.insert(0, str(path.parent))  # let the job import its sibling modules
        spec = importlib.util.spec_from_file_location(f"{JOB_MODULE_PREFIX}{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(1 if code is not None else 0, os.getcwd())
        module = importlib.import_module(target)
    try:
        return getattr(module, function)
    except AttributeError:
        raise AttributeError(f"entrypoint {entrypoint!r}: {target} has no function {function!r}") from None


def run_program(entrypoint: str, kind: str, args: list[str], code: Path | None = None) -> None:
    """Run a script (kind "script": an absolute .py path) or a module (kind "module") as __main__
    with `args` as sys.argv[1:], the way the Python command line does: a script's folder, or for
    a module the working directory, comes first on sys.path. Raises what the program raises,
    SystemExit included."""
    if kind == "script":
        sys.argv = [entrypoint, *args]
        sys.path.insert(0, os.path.dirname(entrypoint))
        runpy.run_path(entrypoint, run_name="__main__")
        return
    sys.argv = [entrypoint, *args]  # run_module puts the module's file in argv[0], as `python -m` does
    sys.path.insert(0, str(code) if code is not None else os.getcwd())
    if code is not None:
        sys.path.insert(1, os.getcwd())
    runpy.run_module(entrypoint, run_name="__main__", alter_sys=True)


def succeeded(exc: SystemExit) -> bool:
    """sys.exit(), sys.exit(None) and sys.exit(0) end an entrypoint successfully."""
    return exc.code in (None, 0)


def exit_code(exc: SystemExit) -> int:
    """The process exit code Python gives a SystemExit: its int, else 1 (a message is printed)."""
    return exc.code if isinstance(exc.code, int) and not isinstance(exc.code, bool) and exc.code else 1
