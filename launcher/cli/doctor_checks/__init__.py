"""`jaxlaunch doctor`: is this machine's installation able to run and submit jobs?

Each check gives a status (ok, warn, fail), what it found, and the fix when something is wrong.
Everything that imports JAX, mpi4py or mpi4jax runs in a subprocess of this Python, with a
timeout: the CLI process never imports JAX, and a probe that crashes or hangs becomes a failed
check instead of taking doctor down. The probes start together and run side by side, so the
whole report takes about as long as the slowest one (importing mpi4jax, ~2 s).

Each backend adds its own rows (Backend.start_doctor_checks: Slurm's commands and controller,
launcher/backends/slurm/doctor.py), started with the probes here. The checks and their
subprocesses are launcher/checks.py's.

Given a spec with a `container:` section, doctor also checks its runtime and starts the image's
Python once, through the same command the ranks use: jaxlaunch must be installed there, in the
host's version, with the host's MPI (launcher/container.py: the hybrid model).

Entry points: `run_checks(env, spec)`, `format_checks(checks)`, `exit_code(checks)`.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Started, which
from .containers import container_checks, container_runtimes, start_container_probes
from ...launchers.mpirun import find_mpirun, mpi_checks
from .mpi import mpi4jax_check, transport_rows
from .probes import COMMAND_TIMEOUT, JAX_PROBE, MPI4JAX_PROBE, MPI4PY_PROBE, jax_check, python_probe

# --- the rest ----------------------------------------------------------------------------------

def run_root_check(cwd: Path) -> Check:
    """`runs/` in the working directory, the default parent of run directories (created on the
    first run, so without it the working directory itself must be writable)."""
    root = cwd / "runs"
    fix = ("run jaxlaunch from a folder you can write, or choose the run directory: --run-dir DIR, or "
           "run_dir: in the spec")
    if root.exists() and not root.is_dir():
        return Check("run directory root", FAIL, f"{root} is not a folder, so runs/{{name}}-{{time}} cannot be "
                     "made there", f"rename or remove {root}; or " + fix)
    target = root if root.exists() else cwd
    try:
        with tempfile.NamedTemporaryFile(dir=target, prefix=".jaxlaunch-doctor-"):
            pass
    except OSError as error:
        return Check("run directory root", FAIL, f"cannot write in {target}: {error.strerror or error}", fix)
    free = shutil.disk_usage(target).free / 2**30
    made = "" if root.exists() else " (the first run creates it)"
    return Check("run directory root", OK, f"{root}: writable{made}; {free:.1f} GiB free")


def run_checks(env: Mapping[str, str] = os.environ, spec=None) -> list[Check]:
    """Every check, in table order. `env` is the environment the probes and the backends' commands run
    in (PATH, SLURM_CONF, XLA_FLAGS...). mpirun is looked up as `jaxlaunch run` does
    (launcher.launchers.mpirun.find_mpirun: beside this Python first, then this process's PATH). `spec`: a
    JobSpec whose container runtime and image are checked too."""
    import launcher
    from ...backends import all_backends
    from ...errors import UsageError

    try:
        mpirun, mpirun_error = find_mpirun(), ""
    except UsageError as error:
        mpirun, mpirun_error = None, str(error)
    gpu_driver = which("nvidia-smi", env)

    # Start every subprocess first; they run side by side while the others are collected.
    mpirun_run = Started([mpirun, "--version"], env, COMMAND_TIMEOUT) if mpirun else None
    mpi4py_run = python_probe(MPI4PY_PROBE, env)
    mpi4jax_run = python_probe(MPI4JAX_PROBE, env)
    jax_run = python_probe(JAX_PROBE, env)
    backend_checks = [backend.start_doctor_checks(env) for backend in all_backends()]  # Slurm: scontrol ping
    contained = spec is not None and spec.container is not None
    container_answer, container_probe = start_container_probes(spec, env) if contained else (None, None)

    mpi = mpi_checks(mpirun, mpirun_error, mpirun_run, mpi4py_run)
    transport = transport_rows(env, mpirun, gpu_driver, mpi4py_run, mpi4jax_run, spec)
    mpirun_text = None
    if mpirun_run is not None:
        outcome = mpirun_run.outcome()  # already collected by mpi_checks: the same answer
        mpirun_text = outcome.stdout if outcome.returncode == 0 else None
    return [
        Check("python", OK, f"{platform.python_version()} ({sys.executable})"),
        Check("jaxlaunch", OK, f"{launcher.__version__} ({Path(launcher.__file__).parent})"),
        *mpi,
        mpi4jax_check(env, mpi4jax_run, gpu_driver),
        jax_check(jax_run, gpu_driver),
        *transport,
        *(check for collect in backend_checks for check in collect()),
        run_root_check(Path.cwd()),
        *(container_checks(spec, env, container_answer, container_probe, mpirun_text) if contained
          else [container_runtimes(env)]),
    ]


def format_checks(checks: list[Check], width: int = 60) -> str:
    """One table: CHECK, STATUS, DETAIL, FIX; long text wraps at `width` characters."""
    from tabulate import tabulate

    rows = [[c.name, c.status, c.detail, c.fix or "-"] for c in checks]
    return tabulate(rows, headers=["CHECK", "STATUS", "DETAIL", "FIX"], maxcolwidths=[None, None, width, width],
                    disable_numparse=True)


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0 (warnings do not fail: local runs work without Slurm)."""
    return 1 if any(c.status == FAIL for c in checks) else 0


# what `jaxlaunch doctor`'s callers and tests take from here
__all__ = ["FAIL", "OK", "WARN", "Check", "Started", "run_checks", "format_checks", "exit_code", "run_root_check"]
