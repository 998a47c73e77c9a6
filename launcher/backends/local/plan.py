"""The local backend's launch plan: the mpirun command and environment that run a spec on this
machine, and what can stop a local run before its run directory exists (pure functions, apart
from finding mpirun)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ... import container
from ...environment import RUN_DIR_ENV
from ...errors import UsageError
from ...rank.topology import EMULATED_PPN, GPU_FIX, missing_for_gpu
from ...rundir import RunDirectory
from ...spec import JobSpec
from ..mpirun import RANK_ENV_DEFAULTS, find_mpirun, mpirun_flags, rank_command


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str]  # added to the caller's environment

    def describe(self) -> str:
        lines = ["command:", "  " + shlex.join(self.argv), "environment:"]
        lines += [f"  {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return "\n".join(lines)


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
