"""`jaxlaunch explain`: what a spec will do, before it is run or queued.

One row per rank (node, local rank, the devices it will see, its global device indices, the
launcher environment it gets, its local mesh), the resources requested per node and in total,
and on Slurm a check of the request against the cluster (partition, nodes, CPUs, GPUs, memory,
time limit; launcher/backends/slurm/fit.py, which `submit` runs too). The device columns come from the
same function that binds devices at run time (launcher/rank/topology.py), not a copy of it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from . import container
from .errors import UsageError
from .backends.mpirun import RANK_ENV_DEFAULTS, rank_command
from .environment import ATTEMPT_ENV, RUN_DIR_ENV
from .rank.topology import DEVICE_AXIS, EMULATED_PPN, GPU_FIX, device_environment, missing_for_gpu
from .spec import JobSpec



@dataclass(frozen=True)
class RankRow:
    rank: int
    node: int
    local_rank: int
    devices: str
    global_devices: str
    env: dict
    mesh: str


def slurm_gpus_visible(spec: JobSpec) -> str | None:
    """CUDA_VISIBLE_DEVICES as Slurm sets it for a job with --gpus-per-node (node-wide)."""
    if spec.platform != "gpu":
        return None
    count = spec.slurm.gpus_per_node or spec.processes_per_node * spec.devices_per_process
    return ",".join(str(i) for i in range(count))


def plan_ranks(spec: JobSpec, target: str, run_dir: Path) -> list[RankRow]:
    rows = []
    d = spec.devices_per_process
    for rank in range(spec.num_processes):
        node, local = divmod(rank, spec.processes_per_node)
        base = {}
        if target == "slurm" and spec.platform == "gpu":
            base["CUDA_VISIBLE_DEVICES"] = slurm_gpus_visible(spec)
        device_env = device_environment(spec.platform, d, local, base)
        if spec.platform == "cpu":
            devices = f"{d} host device{'s' if d > 1 else ''}"
        else:
            devices = f"GPU {device_env['CUDA_VISIBLE_DEVICES']}"
        env = {RUN_DIR_ENV: str(run_dir), ATTEMPT_ENV: "0", **device_env}
        if target == "local":
            env[EMULATED_PPN] = str(spec.processes_per_node)
        first = rank * d
        rows.append(RankRow(rank, node, local, devices, f"{first}-{first + d - 1}" if d > 1 else str(first), env,
                            f"Mesh({DEVICE_AXIS}={d})"))
    return rows


def resource_rows(spec: JobSpec) -> list[list]:
    cpus = spec.slurm.cpus_per_task or 1
    gpus = (spec.slurm.gpus_per_node or spec.processes_per_node * spec.devices_per_process) \
        if spec.platform == "gpu" else 0
    per_node = [spec.processes_per_node, spec.processes_per_node * spec.devices_per_process,
                spec.processes_per_node * cpus, gpus]
    return [["per node", *per_node], [f"total ({spec.nodes} node{'s' if spec.nodes > 1 else ''})",
                                      *(n * spec.nodes for n in per_node)]]


def container_lines(spec: JobSpec, target: str, run_dir: Path, workdir: Path) -> list[str]:
    """The command that starts each rank in the spec's image, as `run` (target local) or the batch
    script (slurm) runs it; nothing without a container."""
    if spec.container is None:
        return []
    try:
        if target == "local":
            container.refuse_local_pyxis(spec)
        program = rank_command(spec, "python", run_dir, workdir)
        srun = []
        if target == "slurm" and spec.slurm.launch == "srun":
            from .backends.slurm.render import batch_environment

            srun = container.srun_options(spec, run_dir, workdir, list(batch_environment(spec, run_dir)))
    except UsageError as error:
        return ["", f"container: {error}"]
    started_by = "srun ... " if srun else ""
    return ["", f"each rank runs in the {spec.container.runtime} image {spec.container.image}:",
            "  " + started_by + shlex.join([*srun, *program])]


def format_explain(spec: JobSpec, target: str, run_dir: Path, problems: list[str] = (),
                   warnings: list[str] = (), workdir: Path | None = None) -> str:
    from tabulate import tabulate

    rows = plan_ranks(spec, target, run_dir)
    shared = {k: v for k, v in rows[0].env.items() if all(r.env.get(k) == v for r in rows)}
    table = tabulate([[r.rank, r.node, r.local_rank, r.devices, r.global_devices, r.mesh,
                       " ".join(f"{k}={v}" for k, v in r.env.items() if k not in shared) or "-"] for r in rows],
                     headers=["RANK", "NODE", "LOCAL", "DEVICES", "GLOBAL DEVICES", "MESH", "ENV (per rank)"])
    where = "this machine, under mpirun" if target == "local" else f"Slurm ({spec.slurm.launch} inside the allocation)"
    every = {**RANK_ENV_DEFAULTS, **shared, **spec.env, **container.rank_environment(spec)}
    lines = [f"{spec.name}: {spec.nodes} node(s) x {spec.processes_per_node} process(es) x "
             f"{spec.devices_per_process} {spec.platform} device(s) = {spec.num_processes} ranks, "
             f"{spec.num_processes * spec.devices_per_process} devices; on {where}", "", table, "",
             "every rank also gets: " + " ".join(f"{k}={v}" for k, v in every.items()),
             *container_lines(spec, target, run_dir, workdir or Path.cwd()), "",
             tabulate(resource_rows(spec), headers=["RESOURCES", "PROCESSES", "DEVICES", "CPUS", "GPUS"])]
    if target == "local" and problems:
        lines += ["", *(f"refused: {p}" for p in problems)]
    if target == "slurm":
        lines += ["", *(f"refused: {p}" for p in problems), *(f"warning: {w}" for w in warnings)]
        if not problems:
            lines.append("the request fits the cluster" if not warnings else "the request was not fully checked")
    return "\n".join(lines).rstrip() + "\n"


def check_this_machine(spec: JobSpec) -> list[str]:
    """What stops the spec from running here with `jaxlaunch run` that explain can see: today,
    `platform: gpu` without a GPU or without JAX's CUDA plugin (JAX itself fails with a bare
    AssertionError). Each problem ends with its fix."""
    if spec.platform != "gpu":
        return []
    missing = missing_for_gpu(plugins=["(in the image)"] if spec.container is not None else None)
    return [] if missing is None else [f"platform: gpu, but {missing}. Fix: {GPU_FIX}"]


# --- the request against the cluster ----------------------------------------------------------
