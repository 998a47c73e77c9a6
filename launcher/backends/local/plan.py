"""The local backend's launch plan: the mpirun command and environment that run a spec on this
machine (and the Plan objects that `render --target mpirun`, `run --dry-run` and the start
share), what can stop a local run before its run directory exists, and where `explain` says the
ranks run (pure functions, apart from finding mpirun)."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ... import container
from ...environment import RUN_DIR_ENV
from ...errors import UsageError
from ...rank.topology import BINDING_FIX, EMULATED_PPN, GPU_FIX, gpus_short_here, missing_for_gpu
from ...rundir import RunDirectory
from ...spec import JobSpec
from ...launchers import mpirun as mpirun_launcher  # find_mpirun looked up when called (tests replace it)
from ...launchers.rank_start import RANK_ENV_DEFAULTS, rank_command
from ..base import Placement, Plan


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
    mpirun_launcher.find_mpirun()
    container.refuse_local_pyxis(spec)
    missing = _missing_for_gpu(spec)
    if missing is not None:
        raise UsageError(f"platform: gpu, but {missing} (try `jaxlaunch explain`).\n  fix: {GPU_FIX}")


def oversubscribed(spec: JobSpec, cores: int | None = None) -> str | None:
    """A warning when the job's processes outnumber this machine's cores (64 ranks on 2 cores ran
    for 37.6 s at a load average of 36, without a word); None when they fit. A CPU job's emulated
    devices (devices_per_process) share their process's cores by design, and are not counted."""
    cores = cores or os.cpu_count() or 1
    if spec.num_processes <= cores:
        return None
    return (f"{spec.num_processes} processes on {cores} cores here: they take turns on the cores (oversubscribed), "
            f"so each runs slower and timings mean little; fewer processes (-n, -N) fit this machine")


def _missing_for_gpu(spec: JobSpec) -> str | None:
    if spec.platform != "gpu":
        return None
    # In a container image, the image's JAX is the one that needs the plugin.
    return missing_for_gpu(plugins=["(in the image)"] if spec.container is not None else None)


def problems_here(spec: JobSpec) -> list[str]:
    """What stops the spec from running here with `jaxlaunch run` that explain can see:
    `platform: gpu` without a GPU or without JAX's CUDA plugin (JAX itself fails with a bare
    AssertionError), or with more GPUs per node than this machine has (the ranks past them are
    refused as they start). Each problem ends with its fix."""
    missing = _missing_for_gpu(spec)
    if missing is not None:
        return [f"platform: gpu, but {missing}. Fix: {GPU_FIX}"]
    short = None if spec.platform != "gpu" else gpus_short_here(
        spec.processes_per_node, spec.devices_per_process, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return [] if short is None else [f"{short}. Fix: {BINDING_FIX}"]


def placement(spec: JobSpec) -> Placement:
    """This machine: every rank is told how many processes a node would have (the emulated node)."""
    return Placement("this machine, under mpirun", rank_env={EMULATED_PPN: str(spec.processes_per_node)})


def container_command(spec: JobSpec, run_dir: Path, workdir: Path) -> str:
    """One rank's command in the image, as mpirun starts it here (never pyxis: it needs srun)."""
    container.refuse_local_pyxis(spec)
    return shlex.join(rank_command(spec, "python", run_dir, workdir))


def plan_local_run(spec: JobSpec, run: RunDirectory, mpirun: str, python: str, is_root: bool,
                   workdir: Path | None = None) -> LaunchPlan:
    """Pure (but for the default `workdir`, this process's): the command and environment that run
    `spec` on this machine."""
    container.refuse_local_pyxis(spec)
    program = rank_command(spec, python, run.path, workdir or Path.cwd())
    argv = mpirun_launcher.local_mpirun_argv(mpirun, spec.num_processes, is_root, program)
    env = {**RANK_ENV_DEFAULTS, **spec.env, RUN_DIR_ENV: str(run.path), EMULATED_PPN: str(spec.processes_per_node),
           **container.rank_environment(spec)}
    return LaunchPlan(argv=argv, env=env)


class LocalPlan(Plan):
    """`jaxlaunch run` of one spec, planned: the mpirun command and environment for this machine's
    mpirun, Python and working directory. `describe()` shows them for `run_dir`; `launch_plan`
    gives them for the run directory the run got (the same, unless that name was taken meanwhile)."""

    def __init__(self, spec: JobSpec, run_dir: Path, requested=None):
        super().__init__(spec, run_dir, requested)
        self.spec = spec
        self.mpirun, self.python = mpirun_launcher.find_mpirun(), sys.executable
        self.is_root, self.workdir = os.geteuid() == 0, Path.cwd()
        self.launch = self.launch_plan(self.run_dir)

    def launch_plan(self, run_dir: Path) -> LaunchPlan:
        return plan_local_run(self.spec, RunDirectory(run_dir), self.mpirun, self.python, self.is_root, self.workdir)

    def describe(self) -> str:
        return self.launch.describe() + "\n"


class LocalSweepPlan(Plan):
    """`jaxlaunch run --dry-run` of a sweep: its configurations and the sweep directory."""

    def __init__(self, sweep, run_dir=None, max_parallel: int | None = None):
        from ...sweeps.directory import SweepDirectory

        super().__init__(sweep, SweepDirectory.preview(sweep, run_dir).path, run_dir)
        self.sweep, self.max_parallel = sweep, max_parallel

    def describe(self) -> str:
        return f"{self.sweep.describe()}\nsweep directory: {self.run_dir}\n"
