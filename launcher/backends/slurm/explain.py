"""`jaxlaunch explain --target slurm`: where a Slurm job's ranks run and what they see there, the
command that starts one rank in the spec's container image (fit.py checks the request against the
cluster). Pure."""

from __future__ import annotations

import shlex
from pathlib import Path

from ...spec import JobSpec
from ..base import Placement
from ...launchers.rank_start import rank_command
from .render import batch_environment, pyxis_options


def placement(spec: JobSpec) -> Placement:
    """Inside the allocation; a GPU job's ranks see every GPU of their node (Slurm sets
    CUDA_VISIBLE_DEVICES for --gpus-per-node) before each picks its own."""
    node_env = {}
    if spec.platform == "gpu":
        node_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(spec.gpus_per_node))
    return Placement(f"Slurm ({spec.slurm.launch} inside the allocation)", node_env)


def container_command(spec: JobSpec, run_dir: Path, workdir: Path) -> str:
    """One rank's command in the image as the batch script starts it: behind srun's options
    (shown as 'srun ... ') for pyxis under `slurm.launch: srun`."""
    program = rank_command(spec, "python", run_dir, workdir)
    srun = []
    if spec.slurm.launch == "srun":
        srun = pyxis_options(spec, run_dir, workdir, list(batch_environment(spec, run_dir)))
    return ("srun ... " if srun else "") + shlex.join([*srun, *program])
