"""The unit tier's guard (tests/conftest.py turns it on for each test under tests/unit): a unit test
may not start mpirun or a Slurm command, in its own process or in any Python process it starts.
Those import this module at startup (as `sitecustomize`: the unit tier puts this folder first on
PYTHONPATH) and, while JAXLAUNCH_UNIT_GUARD names a log file, refuse such a command and write it
there; the test's teardown reads the log and fails the test."""

import os
import shutil
import sys
import tempfile

GUARD_ENV = "JAXLAUNCH_UNIT_GUARD"            # the log file each refused command is written to
REAL_ENV = "JAXLAUNCH_UNIT_GUARD_REAL"        # folders that hold real programs even under the temp dir
# Programs that start MPI ranks or talk to (or start work on) a Slurm cluster.
FORBIDDEN = frozenset({"mpirun", "mpiexec", "orterun", "prterun", "prte", "srun", "sbatch", "salloc", "squeue",
                       "scontrol", "scancel", "sacct", "sinfo", "sstat", "strigger"})
# Doctor's probes start nothing: which MPI `mpirun --version` is, and whether `scontrol ping`
# reaches a controller (without a configuration, as here and in CI's unit tier, it says so at once).
PROBES = {("mpirun", "--version"), ("scontrol", "ping")}


def refusal(argv, env=None) -> str | None:
    """Why `argv` may not run in the unit tier, or None when it may."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    argv = [os.fsdecode(a) for a in argv]
    name = os.path.basename(argv[0]) if argv else ""
    if name not in FORBIDDEN or (name, *argv[1:]) in PROBES:
        return None
    path = (env if env is not None else os.environ).get("PATH")
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=path)
    if program is None or not os.path.exists(program) or _is_stand_in(program):
        return None  # none there (the test checks what happens without it), or a stand-in
    return (f"the unit tier starts no MPI job and asks no Slurm: {' '.join(argv)[:300]} "
            f"(a test that needs it belongs in tests/e2e or tests/slurm)")


def _is_stand_in(program: str) -> bool:
    """A program a test wrote into a temporary folder (a fake `sbatch` that prints an error, a
    recorder), not one of this checkout or this Python (which CI may have cloned under /tmp)."""
    real = os.path.realpath(program)
    inside = lambda folder: real.startswith(os.path.realpath(folder) + os.sep)  # noqa: E731
    real_homes = [sys.prefix, *filter(None, os.environ.get(REAL_ENV, "").split(os.pathsep))]
    return inside(tempfile.gettempdir()) and not any(inside(home) for home in real_homes)


def _audit(event, args):
    if event not in ("subprocess.Popen", "os.posix_spawn", "os.exec") or not os.environ.get(GUARD_ENV):
        return
    if event == "subprocess.Popen":
        executable, argv, env = args[0], args[1], args[3]
        if executable and not isinstance(argv, (str, bytes)):
            argv = [executable, *list(argv)[1:]]
    else:
        argv, env = args[1], args[2]
    why = refusal(argv, env)
    if why is None:
        return
    try:
        with open(os.environ[GUARD_ENV], "a") as log:
            log.write(f"pid {os.getpid()} ({os.path.basename(sys.argv[0] or sys.executable)}): {why}\n")
    except OSError:
        pass
    raise PermissionError(why)


def install() -> None:
    """Once per process (audit hooks cannot be removed; the hook is idle while GUARD_ENV is unset)."""
    if not getattr(sys, "_jaxlaunch_unit_guard", False):
        sys._jaxlaunch_unit_guard = True
        sys.addaudithook(_audit)


if os.environ.get(GUARD_ENV):
    install()
