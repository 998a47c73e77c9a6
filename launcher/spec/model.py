"""The typed job spec: JobSpec and its `slurm:` and `container:` sections, with every key's type,
default, range and description. Everything after loading trusts a JobSpec: making one checks it
(see fields.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from .fields import (Anything, Boolean, Choice, Integer, ListOf, MappingOf, Optional, Parsed, Record, Section,
                     Text, field)

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
RUN_DIR_PLACEHOLDERS = ("{name}", "{time}")
TRANSPORTS = ("auto", "mpi4jax", "xla")  # launcher collectives: JobSpec.collectives_transport


# --- durations ----------------------------------------------------------------------------

_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(value: Any) -> int:
    """Seconds from 90, "90s", "30m", "1h30m", "2d", "HH:MM:SS", "MM:SS" or "D-HH:MM:SS"."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and re.fullmatch(r"(\d+[dhms])+", value.strip()):
        seconds = sum(int(n) * _DURATION_UNITS[u] for n, u in re.findall(r"(\d+)([dhms])", value))
    elif isinstance(value, str) and re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", value.strip()):
        days, _, clock = value.strip().rpartition("-")
        parts = [int(p) for p in clock.split(":")]
        if days:  # Slurm's D-HH[:MM[:SS]]
            parts += [0] * (3 - len(parts))
        else:  # Slurm's MM, MM:SS or HH:MM:SS
            parts = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
        hours, minutes, secs = parts
        seconds = int(days or 0) * 86400 + hours * 3600 + minutes * 60 + secs
    else:
        raise ValueError(
            f"{value!r} is not a duration; write seconds (90), '30m', '1h30m', '2d' or 'HH:MM:SS'"
        )
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return seconds


# The hang watchdog's automatic limit (hang_timeout: auto): a job that made no progress for
# max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR x its slowest step so far) is hung. Generous on purpose:
# a healthy job must never meet it (an evaluation between reports counts as one long step).
HANG_FLOOR_SECONDS = 600
HANG_STEP_FACTOR = 20
# With `auto`, a stall in which the ranks stand at different places (some waiting for their peers,
# one elsewhere, idle) is the classic hang with a culprit: it is ended after this long.
HANG_SPLIT_SECONDS = 120
AUTO = "auto"


def parse_hang_timeout(value: Any) -> int | str:
    """'auto', or a duration in seconds."""
    if isinstance(value, str) and value.strip() == AUTO:
        return AUTO
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{exc}, or 'auto' (the default: from the job's own step times)") from None


def format_slurm_time(seconds: int) -> str:
    """Slurm's D-HH:MM:SS, rounded up to whole minutes as Slurm does for --time."""
    minutes = -(-seconds // 60)
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


# --- checks of single keys -------------------------------------------------------------------

def _valid_name(value: str) -> None:
    if not JOB_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid job name; use letters, digits, '.', '_' or '-'")


# The four kinds of entrypoint. A function gets the JobContext and returns the job's result; a
# script or module runs as `__main__` with `args` as its sys.argv[1:], like `python FILE` or `python -m`.
FILE_FUNCTION, MODULE_FUNCTION, SCRIPT, MODULE = "file.py:function", "module:function", "script", "module"
ENTRYPOINT_KINDS = {
    FILE_FUNCTION: "a function in a .py file, called with the JobContext",
    MODULE_FUNCTION: "a function in an importable module, called with the JobContext",
    SCRIPT: "a .py file run as __main__ with `args` as its argv (like `python FILE ARGS`)",
    MODULE: "a module run as __main__ with `args` as its argv (like `python -m MODULE ARGS`)",
}
ENTRYPOINT_FORMS = "'train.py', 'pkg.module', 'file.py:function' or 'pkg.module:function'"


def entrypoint_kind(value: str) -> str | None:
    """Which of the four kinds `value` is; None when it is none of them."""
    if value.endswith(".py"):
        return SCRIPT  # also a path whose folders hold a ':'
    target, sep, function = value.rpartition(":")
    if sep:
        if not target or not function.isidentifier():
            return None
        if target.endswith(".py"):
            return FILE_FUNCTION
        return MODULE_FUNCTION if MODULE_NAME.match(target) else None
    return MODULE if MODULE_NAME.match(value) else None


def _valid_entrypoint(value: str) -> None:
    if entrypoint_kind(value) is None:
        raise ValueError(f"{value!r} is not an entrypoint; write {ENTRYPOINT_FORMS}")


def _known_placeholders(value: str) -> None:
    unknown = sorted(set(re.findall(r"\{[^{}]*\}", value)) - set(RUN_DIR_PLACEHOLDERS))
    stray = re.sub(r"\{[^{}]*\}", "", value)
    if unknown:
        raise ValueError(f"{unknown[0]} is not a placeholder; valid: {', '.join(RUN_DIR_PLACEHOLDERS)}")
    if "{" in stray or "}" in stray:
        raise ValueError(f"{value!r} has an unmatched brace; placeholders are {', '.join(RUN_DIR_PLACEHOLDERS)}")
    if not value.strip():
        raise ValueError("the run directory is empty")


def _cache_folder(value: str) -> None:
    if value != "run_dir" and not Path(value).expanduser().is_absolute():
        raise ValueError(f"{value!r} is not 'run_dir' or an absolute folder (the ranks may start elsewhere); "
                         f"write 'run_dir', an absolute path, or null to turn the cache off")


def _env_scalars_to_strings(value: dict) -> dict:
    # YAML turns `OMP_NUM_THREADS: 4` into an int; environment values are strings anyway.
    return {k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, (int, float)) else v
            for k, v in value.items()}


def _env_names(value: dict) -> None:
    for key in value:
        if not ENV_NAME.match(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")


def _options_of(program: str, example: str):
    """A check that each value of a list is an option of `program` (it starts with '-')."""
    def check(values: list) -> None:
        for value in values:
            if not value.startswith("-"):
                raise ValueError(f"{value!r} is not {program} option; write it like {example!r}")
    return check


def _single_sbatch_options(values: list) -> None:
    """Each entry is ONE option: sbatch splits an #SBATCH line on blanks outside quotes, so
    '--hold --begin=now+1hour' in one entry would be two. The value (after '=', or after a short
    option's letter) is quoted whole by the renderer."""
    for value in values:
        if value.startswith("--") and not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*", value.partition("=")[0]):
            raise ValueError(f"{value!r} is not one sbatch option; write one option per entry, like '--mem=8G' "
                             f"or '-C gpu' (a value after '=' may hold spaces)")
        if not value.startswith("--") and not re.fullmatch(r"-[A-Za-z]( .*|\S*)", value):
            raise ValueError(f"{value!r} is not one sbatch option; write one option per entry, like '-C gpu'")


def _mounts_are_absolute(values: list) -> None:
    for value in values:
        parts = value.split(":")
        if len(parts) > 2 or not all(parts):
            raise ValueError(f"{value!r} is not 'SRC' or 'SRC:DST' (paths without ':')")
        if not all(part.startswith("/") for part in parts):
            raise ValueError(f"{value!r}: mount paths must be absolute, like '/scratch' or '/data/in:/in'")
        if "," in value:  # pyxis joins mounts with commas; a path holding one cannot be written there
            raise ValueError(f"{value!r}: a mount path may not hold a comma")


# --- the typed spec -----------------------------------------------------------------------

# Seconds, written as 90, "30m", "1h30m" or "HH:MM:SS" in the spec.
DURATION = Parsed(parse_duration, "duration: seconds, `30m`, `1h30m`, `2d` or `HH:MM:SS`")
COUNT = Integer(minimum=1)
STRINGS = ListOf(Text())


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlurmSpec(Record):
    partition: str | None = field(Optional(Text()), "the Slurm partition (sbatch --partition)", None)
    time: int | None = field(
        Optional(DURATION), "time limit: seconds, '30m', '2h' or 'HH:MM:SS' (default: the job's timeout)", None)
    account: str | None = field(Optional(Text()), "the account to charge (sbatch --account)", None)
    qos: str | None = field(Optional(Text()), "quality of service (sbatch --qos)", None)
    gpus_per_node: int | None = field(
        Optional(COUNT), "GPUs to request per node (default on gpu: processes_per_node x devices_per_process)", None)
    gres: str | None = field(
        Optional(Text()), "a raw --gres value such as 'gpu:a100:4', instead of gpus_per_node", None)
    cpus_per_task: int | None = field(Optional(COUNT), "CPU cores per process (sbatch --cpus-per-task)", None)
    launch: str = field(
        Choice("mpirun", "srun"), "'mpirun' inside the allocation, or 'srun' with the cluster's PMI", "mpirun")
    srun_mpi: str = field(Text(), "srun --mpi plugin used when launch is srun", "pmix")
    max_requeues: int = field(
        Integer(minimum=0), "requeues after a preemption or time-limit notice (counted apart in status); "
                            "once spent the job ends FAILED", 3)
    checkpoint_notice: int = field(
        DURATION, "how long before the time limit Slurm warns the job (sbatch --signal=B:USR2@...), so it can "
                  "checkpoint and requeue: seconds, '2m', ...", 90)
    extra: list[str] = field(STRINGS, "extra #SBATCH directives, each like '--mem=8G'", factory=list,
                             checks=(_options_of("an sbatch", "--mem=8G"), _single_sbatch_options))
    health_check: str | None = field(
        Optional(Text()), "a shell command run once on every node before the ranks start; a node where it fails "
                          "is replaced by a spare node, else excluded and the job requeued (counts against "
                          "max_requeues)", None)
    spare_nodes: int = field(
        Integer(minimum=0), "extra nodes to allocate beside `nodes`: when a node fails under the job (or fails the "
                            "health check, or holds up a hang), the ranks restart from the latest checkpoint inside "
                            "the same allocation with a spare in its place, with no requeue; once spares run out the "
                            "job requeues as before", 0)


# Signals a preemption notice may be delivered as (preemption_signal). Not SIGUSR2: that is the
# notice itself. Not SIGKILL/SIGSTOP: no program can handle them.
PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT", "SIGHUP")
OUTPUT_MODES = ("tagged", "plain", "rank0")  # the ranks' output on the console: supervisor/streams.py
CONTAINER_RUNTIMES = ("apptainer", "pyxis", "charliecloud")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContainerSpec(Record):
    image: str = field(Text(), "the image: an apptainer .sif file or URI, a pyxis/enroot image (registry name or "
                               ".sqsh file), or a charliecloud image directory")
    runtime: str = field(Choice(*CONTAINER_RUNTIMES), "how each rank enters the image: 'apptainer' or "
                                                      "'charliecloud' (under mpirun or srun), 'pyxis' (srun only)")
    mounts: list[str] = field(STRINGS, "extra bind mounts, 'SRC' or 'SRC:DST' (absolute paths); the run directory, "
                                       "the working directory and the entrypoint's folder are always mounted",
                              factory=list, checks=(_mounts_are_absolute,))
    gpu: bool | None = field(
        Optional(Boolean()), "give the ranks the host's GPUs (apptainer --nv); default: platform is gpu", None)
    python: str = field(Text(), "the Python inside the image that has jaxlaunch installed; an absolute path, "
                                "because charliecloud keeps the host's PATH", "/opt/venv/bin/python")
    options: list[str] = field(STRINGS, "extra options for the runtime, each one argument, like '--writable-tmpfs' "
                                        "(apptainer exec), '--join' (ch-run) or '--container-remap-root' (srun)",
                               factory=list, checks=(_options_of("a container runtime", "--writable-tmpfs"),))


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSpec(Record):
    name: str = field(Text(), "job name: letters, digits, '.', '_' or '-', at most 64 characters",
                      checks=(_valid_name,))
    entrypoint: str = field(
        Text(), "what each rank runs: a script 'train.py' or a module 'pkg.train' (run as __main__ with `args`), "
                "or a function 'file.py:main' or 'pkg.module:main' (called with the JobContext)",
        checks=(_valid_entrypoint,))
    args: list[str] = field(STRINGS, "a script's or module's command-line arguments (its sys.argv[1:]); "
                                     "`jaxlaunch run SPEC -- ARG...` appends to them", factory=list)
    params: dict[str, Any] = field(MappingOf(Anything()), "passed to the entrypoint as ctx.params", factory=dict)
    nodes: int = field(COUNT, "number of nodes (hosts)", 1)
    processes_per_node: int = field(COUNT, "MPI processes per node", 1)
    devices_per_process: int = field(COUNT, "JAX devices each process sees", 1)
    platform: str = field(Choice("cpu", "gpu"), "'cpu' or 'gpu'", "cpu")
    jax_distributed: bool = field(
        Boolean(), "also start JAX's own multi-process runtime (jax.distributed), for global meshes", False)
    jax_distributed_timeout: int = field(
        DURATION, "how long jax.distributed waits for every process to connect at start-up: seconds, '15m', ...; "
                  "JAX's own 300 s is too short for cold starts on many hosts", 900)
    transport: str = field(
        Choice(*TRANSPORTS), "how launcher.allreduce, broadcast and allgather move device arrays between processes: "
                             "'mpi4jax' (MPI), 'xla' (XLA's own collectives over a mesh of every process: gloo on CPU, "
                             "NCCL on GPU; needs jax_distributed: true) or 'auto' (xla for GPU jobs with "
                             "jax_distributed, else mpi4jax; `jaxlaunch explain` says which and why)", "auto")
    env: dict[str, str] = field(MappingOf(Text(), before=_env_scalars_to_strings),
                                "environment variables for every process", factory=dict, checks=(_env_names,))
    setup: list[str] = field(
        STRINGS, "shell commands run before launch in batch scripts (module load, ...)", factory=list)
    run_dir: str | None = field(
        Optional(Text()), "run directory, relative to the spec's folder; may use {name} and {time}; default "
                          "runs/{name}-{time} in the working directory", None, checks=(_known_placeholders,))
    timeout: int | None = field(
        Optional(DURATION), "wall-clock limit: seconds, '30m', '2h' or 'HH:MM:SS'; the job is killed after it",
        None)
    collective_timeout: int | None = field(
        Optional(DURATION), "longest any rank may wait in one launcher collective before the job is stopped with "
                            "a hang report naming the ranks that never arrived: seconds, '5m', ...; null: no "
                            "limit", 1800)
    hang_timeout: int | str | None = field(
        Optional(Parsed(parse_hang_timeout, "`auto` or a duration")),
        "the hang watchdog: stop the job, naming the rank that holds it up, when no rank has made progress (a "
        "ctx.report, or in a program that never reports, any rank's stack moving) for this long; `auto`: 2 min "
        "when idle ranks stand apart from ranks waiting for them (no CPU, no I/O, no busy child), else max(10 "
        "min, 20x the slowest step so far); a rank stopped 5 s or silent 10 s is named in any phase; a "
        "checkpoint save or restore gets 4x; a compile that stands still 30 min (or 4x the longest); null: off "
        "(docs/how-to/debug-hang.md)",
        AUTO)
    preemption_signal: str | None = field(
        Optional(Choice(*PREEMPTION_SIGNALS)), "also deliver a preemption notice to every rank's process as this "
                                               "signal, for programs with their own handler (orbax and JAX's "
                                               "preemption sync point listen for SIGTERM); default: none, the "
                                               "notice reaches the job through ctx.should_stop() only", None)
    output: str = field(
        Choice(*OUTPUT_MODES), "how the ranks' output reaches the console: 'tagged' (every rank's, each line "
                               "prefixed `[rank N] `, as mpirun --tag-output), 'plain' (every rank's, no prefix) or "
                               "'rank0' (rank 0's only, no prefix); a program's stdout stays stdout; every rank's "
                               "log keeps all of its own", "tagged")
    max_restarts: int = field(
        Integer(minimum=0), "restarts of the whole job after a failure (ctx.attempt tells the job which attempt)", 0)
    stop_repeated_failures: bool = field(
        Boolean(), "do not restart, requeue or move to a spare node an attempt that failed the program's own way "
                   "(an exception, an exit, a hang) at the same place as the attempt before, with no checkpoint "
                   "written between: the job ends with the reason; false: every failure is retried", True)
    keep_checkpoints: int = field(
        COUNT, "how many of the newest checkpoints ctx.checkpoints keeps in RUN_DIR/checkpoints", 2)
    async_checkpoints: bool = field(
        Boolean(), "ctx.checkpoints.save returns once the state is in host memory and writes it in the "
                   "background; false: every save blocks until it is on disk", True)
    compile_cache: str | None = field(
        Optional(Text()), "JAX's persistent compilation cache, shared by the job's attempts, restarts and requeues: "
                          "`run_dir` (RUN_DIR/compile-cache), an absolute folder to share between jobs, or null (off); "
                          "kept per jaxlib version and machine kind, 0700", "run_dir", checks=(_cache_folder,))
    snapshot: bool = field(
        Boolean(), "copy the job's code (the entrypoint's folder, else the working directory) into RUN_DIR/code "
                   "when the run directory is made, and run that copy: edits made while the job waits in the queue "
                   "do not reach it", False)
    max_parallel: int | None = field(
        Optional(COUNT), "sweeps: configurations running at once (Slurm --array %M; locally default 1); "
                         "--max-parallel overrides it", None)
    sweep_limit: int = field(
        COUNT, "sweeps: the most configurations a sweep may expand to, so a typo cannot submit a million jobs; "
               "raise it on purpose", 1000)
    slurm: SlurmSpec = field(Section(SlurmSpec), "settings for `jaxlaunch submit`", factory=SlurmSpec)
    container: ContainerSpec | None = field(
        Optional(Section(ContainerSpec)), "run every rank inside a container image (the supervisor stays on the "
                                          "host); default: no container", None)

    @property
    def num_processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def gpus_per_node(self) -> int:
        """GPUs each node asks for: slurm.gpus_per_node, else one per device of its processes; 0 on CPU."""
        if self.platform != "gpu":
            return 0
        return self.slurm.gpus_per_node or self.processes_per_node * self.devices_per_process

    @property
    def cpus_per_process(self) -> int:
        """CPUs each process asks for: slurm.cpus_per_task, else 1."""
        return self.slurm.cpus_per_task or 1

    def collectives_transport(self) -> tuple[str, str]:
        """(transport, why): what launcher's collectives use for device arrays in this job's ranks."""
        if self.transport != "auto":
            return self.transport, f"set in the spec (transport: {self.transport})"
        if not self.jax_distributed:
            return "mpi4jax", "auto: XLA's collectives need jax_distributed: true"
        if self.platform == "cpu":
            return "mpi4jax", ("auto: on CPU, XLA's collectives go through gloo, measured 2.5-100x slower than "
                               "mpi4jax (docs/design/collectives.md, Transports)")
        return "xla", ("auto: on GPU, XLA's collectives use NCCL; mpi4jax stages through host memory unless "
                       "MPI is CUDA-aware (jaxlaunch doctor)")

    @property
    def entrypoint_kind(self) -> str:
        """FILE_FUNCTION, MODULE_FUNCTION, SCRIPT or MODULE."""
        return entrypoint_kind(self.entrypoint)

    @property
    def runs_program(self) -> bool:
        """A script or module, run as __main__ (it returns no value); else a function given the context."""
        return self.entrypoint_kind in (SCRIPT, MODULE)

    @property
    def entrypoint_file(self) -> Path | None:
        """The .py file of a script or a file.py:function entrypoint; None for a module."""
        kind = self.entrypoint_kind
        if kind == SCRIPT:
            return Path(self.entrypoint)
        return Path(self.entrypoint.rpartition(":")[0]) if kind == FILE_FUNCTION else None


SPEC_KEYS = {(): JobSpec, ("slurm",): SlurmSpec, ("container",): ContainerSpec}
