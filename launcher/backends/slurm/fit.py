"""Does a request fit the cluster? `submit` asks before sbatch (exit 2 with the fix if it never
can), and `jaxlaunch explain --target slurm` shows the answer. Reads `scontrol show partition` and
`scontrol show node` once for a whole sweep."""

from __future__ import annotations

import re

from ...errors import SchedulerError, UsageError
from ...spec import JobSpec, parse_duration
from .render import SUPERVISOR_MARGIN_SECONDS, slurm_time_limit
from . import scheduler

def _slurm_seconds(text: str) -> int | None:
    """Slurm's time ([D-]HH:MM:SS, MM:SS, MM), None for UNLIMITED/INFINITE."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    return parse_duration(text)


def _gres_gpus(gres: str) -> int:
    """GPUs in a node's Gres ('gpu:4', 'gpu:a100:4(S:0-1)', '(null)')."""
    total = 0
    for item in gres.split(","):
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def _records(text: str) -> list[dict]:
    return [scheduler.parse_scontrol_record(line) for line in text.splitlines() if line.strip()]


def _mem_request_mb(extra: list[str]) -> int | None:
    for option in extra:
        match = re.fullmatch(r"--mem=(\d+)([KMGT]?)", option.strip(), re.IGNORECASE)
        if match:
            scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
            return int(int(match.group(1)) * scale)
    return None


def _time_fix(spec: JobSpec, max_time: int) -> str:
    """A setting that fits MaxTime. Without slurm.time, Slurm's limit is the timeout plus the
    supervisor's margin, so the timeout must leave room for it."""
    fits_timeout = max_time - SUPERVISOR_MARGIN_SECONDS
    if spec.slurm.time or fits_timeout <= 0:
        fix = f"--set slurm.time={format_duration(max_time)} or less"
        if spec.timeout and spec.timeout > max_time:  # slurm.time may not be shorter than the timeout
            fix += f", and --set timeout={format_duration(max_time)} or less"
        return fix
    return (f"--set timeout={format_duration(fits_timeout)} or less (Slurm's limit is the timeout plus "
            f"{SUPERVISOR_MARGIN_SECONDS} s, for the supervisor's hang report), or set slurm.time")


def format_duration(seconds: int) -> str:
    """A duration as the spec writes it: 240 -> '4m', 5400 -> '1h30m', 90 -> '1m30s'."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _not_checked(exc: SchedulerError) -> str:
    return f"could not check the request against the cluster ({str(exc).splitlines()[0]})"


def read_cluster() -> tuple[list[dict], list[dict]]:
    """(partitions, nodes) as `scontrol show` gives them; SchedulerError if Slurm cannot be asked."""
    return (_records(scheduler.call_slurm(["scontrol", "show", "partition", "--oneliner"], timeout=20)),
            _records(scheduler.call_slurm(["scontrol", "show", "node", "--oneliner"], timeout=20)))


def check_against_cluster(spec: JobSpec, cluster: tuple[list[dict], list[dict]] | None = None
                          ) -> tuple[list[str], list[str]]:
    """(problems that make the request impossible, each with its fix; warnings). `cluster` is
    read_cluster()'s answer, when several specs are checked against one reading."""
    try:
        partitions, nodes = cluster if cluster is not None else read_cluster()
    except SchedulerError as exc:
        return [], [_not_checked(exc)]
    names = [p.get("PartitionName") for p in partitions]
    wanted = spec.slurm.partition or next((p.get("PartitionName") for p in partitions if p.get("Default") == "YES"),
                                          None)
    partition = next((p for p in partitions if p.get("PartitionName") == wanted), None)
    if partition is None:
        if spec.slurm.partition is None:
            return [], ["no default partition: Slurm will choose (or refuse); set slurm.partition"]
        return [f"partition {wanted!r} does not exist; this cluster has {', '.join(filter(None, names))}. "
                f"Fix: --set slurm.partition=NAME with one of them"], []
    in_partition = [n for n in nodes if wanted in n.get("Partitions", "").split(",")]
    problems, warnings = [], []
    total = int(partition.get("TotalNodes", len(in_partition)) or 0)
    asked = spec.nodes + spec.slurm.spare_nodes
    spares = f" ({spec.nodes} + {spec.slurm.spare_nodes} spare)" if spec.slurm.spare_nodes else ""
    fewer = (f"--set slurm.spare_nodes={max(0, total - spec.nodes)}" if spec.slurm.spare_nodes and spec.nodes <= total
             else f"--set nodes={total} or less")
    if asked > total:
        problems.append(f"{asked} nodes requested{spares}; partition {wanted!r} has {total}. "
                        f"Fix: {fewer}, or another partition")
    max_nodes = partition.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and asked > int(max_nodes):
        problems.append(f"{asked} nodes requested{spares}; partition {wanted!r} allows {max_nodes} per job "
                        f"(MaxNodes). Fix: --set nodes={max_nodes} or less" + (" with fewer spare_nodes" if spares else ""))
    limit, max_time = slurm_time_limit(spec), _slurm_seconds(partition.get("MaxTime", ""))
    if not limit:  # no --time in the batch script: the partition's default (else its maximum) applies
        default = partition.get("DefaultTime") if partition.get("DefaultTime") not in (None, "NONE") else None
        applies = (f"its DefaultTime {default}" if default else f"its MaxTime {partition.get('MaxTime', 'UNLIMITED')}")
        warnings.append(f"no time limit in the spec (timeout, slurm.time): partition {wanted!r}'s limit applies, "
                        f"{applies}; set timeout (the supervisor then stops the job with a hang report) or slurm.time")
    if limit and max_time and limit > max_time:
        problems.append(f"time limit {limit} s exceeds partition {wanted!r}'s MaxTime {partition['MaxTime']}. "
                        f"Fix: {_time_fix(spec, max_time)}")
    if in_partition:
        cpus = min(int(n.get("CPUTot", 0) or 0) for n in in_partition)
        need = spec.processes_per_node * (spec.slurm.cpus_per_task or 1)
        if need > cpus:
            problems.append(f"{need} CPUs per node requested ({spec.processes_per_node} processes x "
                            f"{spec.slurm.cpus_per_task or 1} cpus_per_task); nodes of {wanted!r} have {cpus}. "
                            f"Fix: fewer processes_per_node or cpus_per_task, or more nodes")
        if spec.platform == "gpu":
            gpus = min(_gres_gpus(n.get("Gres", "")) for n in in_partition)
            need_gpus = spec.slurm.gpus_per_node or spec.processes_per_node * spec.devices_per_process
            if spec.slurm.gres:
                need_gpus = _gres_gpus(spec.slurm.gres) or need_gpus
            if gpus == 0:
                problems.append(f"partition {wanted!r} has no GPUs (no gpu gres on its nodes). "
                                f"Fix: --set slurm.partition=<a GPU partition>, or platform: cpu")
            elif need_gpus > gpus:
                problems.append(f"{need_gpus} GPUs per node requested; nodes of {wanted!r} have {gpus}. Fix: "
                                f"processes_per_node x devices_per_process <= {gpus}, or more nodes")
        memory = _mem_request_mb(spec.slurm.extra)
        real = min(int(n.get("RealMemory", 0) or 0) for n in in_partition)
        if memory and real and memory > real:
            problems.append(f"--mem={memory}M per node requested; nodes of {wanted!r} have {real} MB. "
                            f"Fix: a smaller --mem in slurm.extra")
    if partition.get("State", "UP") != "UP":
        warnings.append(f"partition {wanted!r} is {partition.get('State')}: the job will wait until it is UP")
    return problems, warnings


def refuse_if_it_cannot_fit(specs: list[JobSpec]) -> list[str]:
    """For `submit` (one spec, or a sweep's): UsageError (exit 2) if a request can never run here;
    returns the warnings. The cluster is read once for all of them."""
    try:
        cluster = read_cluster()
    except SchedulerError as exc:
        return [_not_checked(exc)]
    problems, warnings = [], []
    for spec in specs:
        found, said = check_against_cluster(spec, cluster)
        problems += [p for p in found if p not in problems]
        warnings += [w for w in said if w not in warnings]
    if problems:
        raise UsageError("the request does not fit the cluster; nothing was submitted:\n"
                         + "\n".join(f"  {p}" for p in problems)
                         + "\n  (jaxlaunch explain SPEC --target slurm shows the whole plan; --no-check skips this)")
    return warnings
