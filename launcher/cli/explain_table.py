"""`jaxlaunch explain`: what a spec will do, before it is run or queued.

One row per rank (node, local rank, the devices it will see, its global device indices, the
launcher environment it gets, its local mesh), the resources requested per node and in total,
and the target backend's check that the request can run there (this machine's GPU; on Slurm,
the cluster's partition, nodes, CPUs, GPUs, memory and time limit, which `submit` checks too).
What depends on the target comes from its backend (Backend.placement, check_fit: a records.Fit
that job_views.py words, container_command). The device columns come from the same function that binds devices at run
time (launcher/rank/topology.py), not a copy of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import container
from ..errors import UsageError
from ..backends import Backend, get_backend
from ..launchers.rank_start import RANK_ENV_DEFAULTS
from ..environment import ATTEMPT_ENV, RUN_DIR_ENV
from ..rank.topology import DEVICE_AXIS, device_environment
from ..spec import JobSpec
from .job_views import fit_lines



@dataclass(frozen=True)
class RankRow:
    rank: int
    node: int
    local_rank: int
    devices: str
    global_devices: str
    env: dict
    mesh: str


def _backend(target: str | Backend) -> Backend:
    """The backend named `target` ("local", "slurm"), or `target` itself."""
    return get_backend(target) if isinstance(target, str) else target


def plan_ranks(spec: JobSpec, target: str | Backend, run_dir: Path) -> list[RankRow]:
    rows = []
    d = spec.devices_per_process
    placement = _backend(target).placement(spec)
    for rank in range(spec.num_processes):
        node, local = divmod(rank, spec.processes_per_node)
        device_env = device_environment(spec.platform, d, local, {**placement.node_env, **spec.env},
                                        spec.hang_timeout)
        if spec.platform == "cpu":
            devices = f"{d} host device{'s' if d > 1 else ''}"
        else:
            devices = f"GPU {device_env['CUDA_VISIBLE_DEVICES']}"
        env = {RUN_DIR_ENV: str(run_dir), ATTEMPT_ENV: "0", **device_env, **placement.rank_env}
        first = rank * d
        rows.append(RankRow(rank, node, local, devices, f"{first}-{first + d - 1}" if d > 1 else str(first), env,
                            f"Mesh({DEVICE_AXIS}={d})"))
    return rows


def program_lines(spec: JobSpec) -> list[str]:
    """What each rank runs, and the variables torchrun-style code reads (rank/bootstrap.py sets them)."""
    from ..spec.model import ENTRYPOINT_KINDS

    kind = spec.entrypoint_kind
    runs = f"runs {spec.entrypoint} ({kind}: {ENTRYPOINT_KINDS[kind]})"
    if spec.runs_program:
        runs += f" with argv {spec.args}"
    return [runs, f"with torchrun's variables: RANK=<RANK> LOCAL_RANK=<LOCAL> WORLD_SIZE={spec.num_processes} "
                  f"LOCAL_WORLD_SIZE={spec.processes_per_node} NODE_RANK=<NODE> GROUP_RANK=<NODE> "
                  f"MASTER_ADDR:MASTER_PORT=JAX_COORDINATOR_ADDRESS=<rank 0's host>:<a free port, chosen at start>"]


def watchdog_lines(spec: JobSpec) -> list[str]:
    """The limits that stop a hung job, as in force (defaults included)."""
    from ..supervisor.watchdog import describe_setting, format_seconds

    collective = (format_seconds(spec.collective_timeout) if spec.collective_timeout
                  else "off (collective_timeout: null)")
    timeout = format_seconds(spec.timeout) if spec.timeout else "none"
    lines = [f"hang watchdog: {describe_setting(spec.hang_timeout)}"]
    if spec.hang_timeout is not None:
        lines.append("progress: each ctx.report() and, in a job that never reports (most programs), each rank's "
                     "stack moving")
    limit = f"the whole job may run {timeout} (timeout)" if spec.timeout else "the whole job has no time limit (timeout: null)"
    return lines + [f"a launcher collective may wait {collective}; {limit}"]


def transport_line(spec: JobSpec) -> str:
    """Which transport launcher's collectives use for device arrays, and why."""
    name, why = spec.collectives_transport()
    what = {"mpi4jax": "mpi4jax (MPI)", "xla": "XLA's collectives over a mesh of every process (" +
            ("NCCL" if spec.platform == "gpu" else "gloo") + ")"}[name]
    return f"launcher collectives: device arrays travel over {what}; {why}"


def resource_rows(spec: JobSpec) -> list[list]:
    per_node = [spec.processes_per_node, spec.processes_per_node * spec.devices_per_process,
                spec.processes_per_node * spec.cpus_per_process, spec.gpus_per_node]
    return [["per node", *per_node], [f"total ({spec.nodes} node{'s' if spec.nodes > 1 else ''})",
                                      *(n * spec.nodes for n in per_node)]]


def container_lines(spec: JobSpec, target: str | Backend, run_dir: Path, workdir: Path) -> list[str]:
    """The command that starts each rank in the spec's image, as the target backend starts it
    (`run`, or the batch script); nothing without a container."""
    if spec.container is None:
        return []
    try:
        command = _backend(target).container_command(spec, run_dir, workdir)
    except UsageError as error:
        return ["", f"container: {error}"]
    return ["", f"each rank runs in the {spec.container.runtime} image {spec.container.image}:", "  " + command]


def requeue_lines(spec: JobSpec, policy) -> list[str]:
    """How a requeued attempt starts again (`policy`: the backend's RequeuePolicy, None for none)."""
    if policy is None:
        return []
    times = f"up to {spec.slurm.max_requeues} time{'s' if spec.slurm.max_requeues != 1 else ''}"
    if policy.expedite:
        return [f"requeue: {times}, expedited (sbatch --requeue=expedite: Slurm {policy.version} allows it "
                f"here): a requeued attempt may start again at once, at top priority"]
    version = f"Slurm {policy.version}" if policy.known else "Slurm"
    if policy.offers_expedite:
        why = f"{version} offers --requeue=expedite, but this cluster does not enable it (SlurmctldParameters=enable_expedited_requeue)"
    else:
        why = f"{version} has no --requeue=expedite (Slurm 25.11 and later, where the cluster enables it)"
    return [f"requeue: {times}; each requeued attempt waits {policy.delay_seconds} s ({policy.delay_from}) before "
            f"it may start again, then for its turn in the queue: {why}"]


def format_explain(spec: JobSpec, target: str | Backend, run_dir: Path, fit=None, workdir: Path | None = None,
                   requeue=None) -> str:
    """The whole of `explain`'s text; `fit` (a records.Fit) the backend's check, None when not checked."""
    from tabulate import tabulate

    backend = _backend(target)
    rows = plan_ranks(spec, backend, run_dir)
    shared = {k: v for k, v in rows[0].env.items() if all(r.env.get(k) == v for r in rows)}
    table = tabulate([[r.rank, r.node, r.local_rank, r.devices, r.global_devices, r.mesh,
                       " ".join(f"{k}={v}" for k, v in r.env.items() if k not in shared) or "-"] for r in rows],
                     headers=["RANK", "NODE", "LOCAL", "DEVICES", "GLOBAL DEVICES", "MESH", "ENV (per rank)"])
    where = backend.placement(spec).where
    every = {**RANK_ENV_DEFAULTS, **shared, **spec.env, **container.rank_environment(spec)}
    lines = [f"{spec.name}: {spec.nodes} node(s) x {spec.processes_per_node} process(es) x "
             f"{spec.devices_per_process} {spec.platform} device(s) = {spec.num_processes} ranks, "
             f"{spec.num_processes * spec.devices_per_process} devices; on {where}", "", table, "",
             "every rank also gets: " + " ".join(f"{k}={v}" for k, v in every.items()),
             *program_lines(spec), *watchdog_lines(spec), transport_line(spec),
             *requeue_lines(spec, requeue), *container_lines(spec, backend, run_dir, workdir or Path.cwd()), "",
             tabulate(resource_rows(spec), headers=["RESOURCES", "PROCESSES", "DEVICES", "CPUS", "GPUS"])]
    checked = fit_lines(fit) if fit is not None else []
    if checked:
        lines += ["", *checked]
    return "\n".join(lines).rstrip() + "\n"
