"""Where this process sits (rank, local rank, node) and which devices it may use. Pure functions
of the environment, so they are unit-tested without MPI or a GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from ..launchers.rank_variables import MPIRUN, SRUN, SRUN_STEP

# Axis name of each process's Mesh over its local devices (ctx.mesh). Here, not in context.py, so
# that `explain` can name it without importing the runtime (logging and all) on the submit path.
DEVICE_AXIS = "devices"

# Set by `jaxlaunch run`, which emulates `nodes` x `processes_per_node` on one machine.
EMULATED_PPN = "JAXLAUNCH_EMULATED_PROCESSES_PER_NODE"


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    node_index: int
    num_nodes: int


def local_rank_from_env(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(local rank, processes on this node) as the launcher set them, or None if unknown.

    Open MPI's mpirun sets OMPI_COMM_WORLD_LOCAL_*; srun sets SLURM_LOCALID for its tasks (the
    launchers' variables: launcher/launchers/rank_variables.py).
    SLURM_LOCALID alone is not trusted: a batch script's own environment has it too (always 0),
    so it counts only inside a step (SLURM_STEP_ID) that srun launched (SLURM_PROCID).
    """
    if EMULATED_PPN in env and MPIRUN.rank in env:
        ppn = int(env[EMULATED_PPN])
        return int(env[MPIRUN.rank]) % ppn, ppn
    if MPIRUN.local_rank in env:
        return int(env[MPIRUN.local_rank]), int(env.get(MPIRUN.local_size, "0")) or None
    if SRUN.local_rank in env and SRUN_STEP in env and SRUN.rank in env:
        tasks = env.get(SRUN.local_size, "")
        match = re.match(r"(\d+)", tasks)
        return int(env[SRUN.local_rank]), int(match.group(1)) if match else None
    return None


def node_name(env: Mapping[str, str]) -> str:
    """The node's name as the scheduler knows it (Slurm's, which can differ from the hostname)."""
    import socket

    return env.get("SLURMD_NODENAME") or socket.gethostname()


def node_index_from_local_ranks(rank: int, local_ranks: list[int]) -> tuple[int, int]:
    """(this rank's node index, number of nodes) from every rank's local rank.

    Launchers map ranks to nodes in blocks (mpirun's default by-slot mapping, srun's block
    distribution), so each node starts where a local rank is 0. Hostnames cannot be used
    instead: emulated and test clusters run several "nodes" on one host.
    """
    starts = [r for r, local in enumerate(local_ranks) if local == 0]
    if not starts or starts[0] != 0:
        raise RuntimeError(f"cannot map ranks to nodes: local ranks {local_ranks} are not in blocks")
    node = sum(1 for s in starts if s <= rank) - 1
    return node, len(starts)


def cpu_device_flags(xla_flags: str, devices: int) -> str:
    """XLA_FLAGS with the host device count set (replacing any earlier value)."""
    kept = [f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count")]
    return " ".join(kept + [f"--xla_force_host_platform_device_count={devices}"])


def visible_gpus(local_rank: int, devices_per_process: int, already_visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for this process, chosen by LOCAL rank.

    - nothing set: GPUs local_rank*d .. local_rank*d+d-1 of the node;
    - Slurm already narrowed it to exactly d GPUs (per-task binding): keep it;
    - a node-wide list (e.g. --gpus-per-node without per-task binding): take our slice of it.
    """
    d = devices_per_process
    if already_visible is None or already_visible.strip() == "":
        return ",".join(str(i) for i in range(local_rank * d, local_rank * d + d))
    ids = [x for x in already_visible.split(",") if x.strip()]
    if len(ids) == d:
        return ",".join(ids)
    if len(ids) < (local_rank + 1) * d:
        raise RuntimeError(
            f"local rank {local_rank} needs GPUs {local_rank * d}..{local_rank * d + d - 1} but "
            f"CUDA_VISIBLE_DEVICES={already_visible!r} lists only {len(ids)}; request more GPUs per node "
            f"(slurm.gpus_per_node) or fewer processes_per_node x devices_per_process"
        )
    return ",".join(ids[local_rank * d:(local_rank + 1) * d])


NCCL_TERMINATION_FLAG = "--xla_gpu_nccl_termination_timeout_seconds"


def nccl_termination_seconds(hang_timeout) -> int | None:
    """XLA's NCCL termination timeout for a spec's hang_timeout: a backstop that ends a process
    stuck in an NCCL collective (XLA's default, -1, waits forever: jax#38503). Twice the hang
    watchdog's limit, so the watchdog, which names the rank holding the job up, comes first;
    `auto` uses twice its floor. None (not set) when the watchdog is off."""
    from ..spec.model import AUTO, HANG_FLOOR_SECONDS

    if hang_timeout is None:
        return None
    limit = HANG_FLOOR_SECONDS if hang_timeout == AUTO else int(hang_timeout)
    return max(2 * limit, limit + 60)


# XLA's own execution watchdog on GPU: armed when an executable is dispatched, released when its
# stream syncs, so it never counts a compile or autotuning (Levanter sets it too). A duration: a
# bare number of seconds is refused by XLA's flag parser, "1200s" is taken.
EXECUTION_TERMINATE_FLAG = "--xla_gpu_execution_terminate_timeout"


def gpu_device_flags(xla_flags: str, hang_timeout) -> str:
    """XLA_FLAGS with the NCCL termination timeout and XLA's execution watchdog, each unless the
    user set it: a second line behind the hang watchdog, at the same bound (twice the watchdog's)."""
    seconds = nccl_termination_seconds(hang_timeout)
    if seconds is None:
        return xla_flags
    flags = xla_flags.split()
    if NCCL_TERMINATION_FLAG not in xla_flags:
        flags.append(f"{NCCL_TERMINATION_FLAG}={seconds}")
    if EXECUTION_TERMINATE_FLAG not in xla_flags:
        flags.append(f"{EXECUTION_TERMINATE_FLAG}={seconds}s")
    return " ".join(flags)


def device_environment(platform: str, devices_per_process: int, local_rank: int,
                       env: Mapping[str, str], hang_timeout=None) -> dict[str, str]:
    """Environment to set before JAX is imported so each process sees its own devices (and, on
    GPU, XLA's NCCL termination timeout from the spec's hang_timeout)."""
    if platform == "cpu":
        return {"JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": cpu_device_flags(env.get("XLA_FLAGS", ""), devices_per_process)}
    gpu = {"JAX_PLATFORMS": "cuda",
           "CUDA_VISIBLE_DEVICES": visible_gpus(local_rank, devices_per_process, env.get("CUDA_VISIBLE_DEVICES"))}
    flags = gpu_device_flags(env.get("XLA_FLAGS", ""), hang_timeout)
    if flags:
        gpu["XLA_FLAGS"] = flags
    return gpu


# --- mpi4jax and CUDA-aware MPI (launcher/cli/doctor_checks/transport.py probes it) ----------------------

USE_CUDA_MPI = "MPI4JAX_USE_CUDA_MPI"


def cuda_aware_record(env: Mapping[str, str]):
    """Where `jaxlaunch doctor` keeps its CUDA-aware-MPI verdicts, per MPI library."""
    from pathlib import Path

    return Path(env.get("JAXLAUNCH_HOME", "~/.jaxlaunch")).expanduser() / "cuda-aware-mpi.json"


def mpi_library_key(version: str) -> str:
    """The first line of MPI_Get_library_version, without the NUL Open MPI ends it with: the key a
    verdict is kept under (doctor and the ranks read the same library)."""
    return (version or "").splitlines()[0].strip().rstrip("\x00").strip() if version else ""


def cuda_mpi_environment(env: Mapping[str, str], library: str, record: dict | None = None) -> dict[str, str]:
    """For a GPU rank, before mpi4jax is imported: {MPI4JAX_USE_CUDA_MPI: "1"} when doctor's probe
    found this MPI library CUDA-aware and neither the job nor the environment sets it; else {}
    (mpi4jax then copies GPU buffers through host memory: slower, never a crash)."""
    import json

    if USE_CUDA_MPI in env:
        return {}
    if record is None:
        try:
            record = json.loads(cuda_aware_record(env).read_text())
        except (OSError, ValueError):
            return {}
    entry = record.get(mpi_library_key(library)) if isinstance(record, dict) else None
    return {USE_CUDA_MPI: "1"} if isinstance(entry, dict) and entry.get("cuda_aware") is True else {}


# What JAX needs for JAX_PLATFORMS=cuda: a GPU (the driver's device files) and a CUDA plugin.
CUDA_PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin")
GPU_FIX = "run on a GPU node, install JAX's CUDA build there (pip install 'jax[cuda12]'), or set platform: cpu"


def binding_beyond_node(visible: str | None, local_rank: int, device_files: list[str] | None = None) -> str | None:
    """Why this rank sees no GPU although the node has some: it was bound to a GPU index the node
    does not have (more processes_per_node x devices_per_process than GPUs), else None. Seen on a
    1-GPU machine with 2 ranks: JAX's own word is CUDA_ERROR_NO_DEVICE, as if there were no GPU."""
    import glob

    if device_files is None:
        device_files = glob.glob("/dev/nvidia[0-9]*")
    ids = [x.strip() for x in (visible or "").split(",") if x.strip()]
    if not device_files or not ids or not all(x.isdigit() for x in ids):
        return None
    count = len(device_files)
    beyond = [x for x in ids if int(x) >= count]
    if not beyond:
        return None
    return (f"local rank {local_rank} was bound to GPU {', '.join(beyond)} (CUDA_VISIBLE_DEVICES={visible}), but this "
            f"node has {count} GPU{'' if count == 1 else 's'}: processes_per_node x devices_per_process asks for "
            f"more GPUs per node than it has")


def gpus_short_here(processes_per_node: int, devices_per_process: int, visible: str | None,
                    device_files: list[str] | None = None) -> str | None:
    """Why a local run's ranks would be bound past this machine's GPUs (each takes its local rank's
    slice: visible_gpus), for `explain` before any rank starts; None when they fit, or when this
    machine has no GPU (missing_for_gpu says so) or names its GPUs by UUID."""
    import glob

    if device_files is None:
        device_files = glob.glob("/dev/nvidia[0-9]*")
    ids = [x.strip() for x in (visible or "").split(",") if x.strip()]
    have = len(ids) if ids else len(device_files)
    need = processes_per_node * devices_per_process
    if not device_files or need <= have or (ids and not all(x.isdigit() for x in ids)):
        return None
    where = f"CUDA_VISIBLE_DEVICES={visible} lists" if ids else "this machine has"
    return (f"processes_per_node x devices_per_process = {processes_per_node} x {devices_per_process} binds "
            f"{need} GPUs per node, but {where} {have}: local rank {have // devices_per_process} and later "
            f"would be bound to a GPU that is not there")


BINDING_FIX = "lower processes_per_node (or devices_per_process) to fit the node's GPUs, or run on nodes with more GPUs"


def missing_for_gpu(device_files: list[str] | None = None, plugins: list[str] | None = None) -> str | None:
    """Why `platform: gpu` cannot run on THIS machine (no NVIDIA GPU, or JAX without its CUDA
    plugin), else None. Without this, JAX's only word is a bare AssertionError in local_devices().
    Reads files and package metadata: JAX is not imported."""
    import glob
    from importlib import metadata

    if device_files is None:
        device_files = glob.glob("/dev/nvidia[0-9]*")
    if not device_files:
        return "this machine has no NVIDIA GPU (no /dev/nvidia0)"
    if plugins is None:
        plugins = []
        for name in CUDA_PLUGINS:
            try:
                plugins.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                pass
    if not plugins:
        return f"JAX's CUDA plugin is not installed here ({' or '.join(CUDA_PLUGINS)})"
    return None
