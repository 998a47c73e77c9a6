"""The job spec: one typed object, loaded from YAML and validated once.

Everything after `load_spec` trusts the JobSpec it gets. Errors name the file, the line, the
key path and the fix, so a user never has to read a traceback to find a typo.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from .errors import SpecError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODULE_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
FORBIDDEN_CHARACTERS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}


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


def format_slurm_time(seconds: int) -> str:
    """Slurm's D-HH:MM:SS, rounded up to whole minutes as Slurm does for --time."""
    minutes = -(-seconds // 60)
    days, minutes = divmod(minutes, 1440)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00"


# --- the typed spec -----------------------------------------------------------------------

# Seconds, written as 90, "30m", "1h30m" or "HH:MM:SS" in the spec.
Duration = Annotated[int, BeforeValidator(parse_duration)]

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class SlurmSpec(_Strict):
    partition: str | None = Field(None, description="the Slurm partition (sbatch --partition)")
    time: Duration | None = Field(
        None, description="time limit: seconds, '30m', '2h' or 'HH:MM:SS' (default: the job's timeout)"
    )
    account: str | None = Field(None, description="the account to charge (sbatch --account)")
    qos: str | None = Field(None, description="quality of service (sbatch --qos)")
    gpus_per_node: int | None = Field(
        None, ge=1, description="GPUs to request per node (default on gpu: processes_per_node x devices_per_process)"
    )
    gres: str | None = Field(None, description="a raw --gres value such as 'gpu:a100:4', instead of gpus_per_node")
    cpus_per_task: int | None = Field(None, ge=1, description="CPU cores per process (sbatch --cpus-per-task)")
    launch: Literal["mpirun", "srun"] = Field(
        "mpirun", description="'mpirun' inside the allocation, or 'srun' with the cluster's PMI"
    )
    srun_mpi: str = Field("pmix", description="srun --mpi plugin used when launch is srun")
    extra: list[str] = Field(
        default_factory=list, description="extra #SBATCH directives, each like '--mem=8G'"
    )

    @field_validator("extra")
    @classmethod
    def _directives_are_options(cls, values):
        for value in values:
            if not value.startswith("-"):
                raise ValueError(f"{value!r} is not an sbatch option; write it like '--mem=8G'")
        return values


class JobSpec(_Strict):
    name: str = Field(description="job name: letters, digits, '.', '_' or '-', at most 64 characters")
    entrypoint: str = Field(description="'package.module:function' or 'path/to/file.py:function'")
    params: dict[str, Any] = Field(default_factory=dict, description="passed to the entrypoint as ctx.params")
    nodes: int = Field(1, ge=1, description="number of nodes (hosts)")
    processes_per_node: int = Field(1, ge=1, description="MPI processes per node")
    devices_per_process: int = Field(1, ge=1, description="JAX devices each process sees")
    platform: Literal["cpu", "gpu"] = Field("cpu", description="'cpu' or 'gpu'")
    jax_distributed: bool = Field(
        False, description="also start JAX's own multi-process runtime (jax.distributed), for global meshes"
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment variables for every process")
    setup: list[str] = Field(
        default_factory=list, description="shell commands run before launch in batch scripts (module load, ...)"
    )
    run_dir: str | None = Field(
        None, description="run directory; may use {name} and {time}; default runs/{name}-{time}"
    )
    timeout: Duration | None = Field(
        None, description="wall-clock limit: seconds, '30m', '2h' or 'HH:MM:SS'; the job is killed after it"
    )
    collective_timeout: Duration | None = Field(
        None, description="longest any rank may wait in one launcher collective before the job is stopped "
                          "with a hang report naming the ranks that never arrived: seconds, '5m', ..."
    )
    max_restarts: int = Field(
        0, ge=0, description="restarts of the whole job after a failure (ctx.attempt tells the job which attempt)"
    )
    slurm: SlurmSpec = Field(default_factory=SlurmSpec, description="settings for `jaxlaunch submit`")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value):
        if not JOB_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid job name; use letters, digits, '.', '_' or '-'")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _valid_entrypoint(cls, value):
        path, sep, function = value.rpartition(":")
        if not sep or not path or not function.isidentifier():
            raise ValueError(f"{value!r} is not 'module:function' or 'file.py:function'")
        if not path.endswith(".py") and not MODULE_ENTRY.match(value):
            raise ValueError(f"{value!r}: {path!r} is neither a module name nor a .py file")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_scalars_to_strings(cls, value):
        # YAML turns `OMP_NUM_THREADS: 4` into an int; environment values are strings anyway.
        if isinstance(value, dict):
            value = {k: str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, (int, float)) else v
                     for k, v in value.items()}
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value):
        for key in value:
            if not ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        return value

    @property
    def num_processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def entrypoint_file(self) -> Path | None:
        path = self.entrypoint.rpartition(":")[0]
        return Path(path) if path.endswith(".py") else None


SPEC_KEYS = {(): JobSpec, ("slurm",): SlurmSpec}


# --- loading -------------------------------------------------------------------------------

class _Source:
    """Where each key of the spec came from: a line of the file, or a --set override."""

    def __init__(self, path: Path, lines: dict[tuple, int], overrides: dict[tuple, str]):
        self.path, self.lines, self.overrides = path, lines, overrides

    def line(self, key_path: tuple) -> int:
        """For sorting errors in file order; --set overrides come last."""
        for n in range(len(key_path), -1, -1):
            if tuple(key_path[:n]) in self.overrides:
                return 1 << 30
            if tuple(key_path[:n]) in self.lines:
                return self.lines[tuple(key_path[:n])]
        return 0

    def locate(self, key_path: tuple) -> str:
        for n in range(len(key_path), -1, -1):
            prefix = tuple(key_path[:n])
            if prefix in self.overrides:
                return f"--set {self.overrides[prefix]}"
            if prefix in self.lines:
                return f"{self.path}:{self.lines[prefix]}"
        return str(self.path)


def _line_map(node, path=(), lines=None, file=None) -> dict[tuple, int]:
    """Line (1-based) of every key in a composed YAML document; rejects duplicate keys."""
    lines = {(): 1} if lines is None else lines
    if isinstance(node, yaml.MappingNode):
        seen = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SpecError(
                    f"{file}:{line}: {'.'.join(map(str, path + (key,)))}: duplicate key "
                    f"(first set on line {seen[key]}).\n  fix: keep only one of them."
                )
            seen[key] = line
            lines[path + (key,)] = line
            _line_map(value_node, path + (key,), lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (index,)] = item.start_mark.line + 1
            _line_map(item, path + (index,), lines, file)
    return lines


def _parse_override(text: str) -> tuple[tuple, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {text}: expected KEY=VALUE, e.g. --set nodes=2 or --set slurm.partition=gpu")
    bad = [label for char, label in FORBIDDEN_CHARACTERS.items() if char in raw]
    if bad and not key.strip().startswith("params."):
        raise SpecError(f"--set {key.strip()}=...: contains {bad[0]}, which could end a line of the batch "
                        f"script and run the rest as a command.\n  fix: write the value on one line.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not YAML: take the text as it is
    return tuple(key.strip().split(".")), value


def _apply_override(data: dict, key_path: tuple, value: Any, text: str) -> None:
    target = data
    for key in key_path[:-1]:
        child = target.get(key)
        if child is None:
            child = target[key] = {}
        if not isinstance(child, dict):
            raise SpecError(f"--set {text}: {key!r} is not a section, so it has no key {key_path[-1]!r}")
        target = child
    target[key_path[-1]] = value


def _forbidden_characters(value, path=()):
    """Paths of strings with a newline, CR or NUL: in a batch script they would end a #SBATCH line."""
    if isinstance(value, str):
        for char, label in FORBIDDEN_CHARACTERS.items():
            if char in value:
                yield path, label
                break
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and any(c in key for c in FORBIDDEN_CHARACTERS):
                yield path + (key,), "a newline, CR or NUL in the key"
            yield from _forbidden_characters(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _forbidden_characters(item, path + (index,))


def _field_help(key_path: tuple) -> str:
    model, field = JobSpec, None
    for key in key_path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or key not in model.model_fields:
            break
        field = model.model_fields[key]
        model = field.annotation
    return field.description if field is not None and field.description else ""


def _describe(error: dict, source: _Source) -> str:
    loc = tuple(error["loc"])
    where = source.locate(loc)
    dotted = ".".join(map(str, loc)) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        section = SPEC_KEYS.get(loc[:-1])
        valid = sorted(section.model_fields) if section else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        scope = f" under {'.'.join(map(str, loc[:-1]))}" if len(loc) > 1 else ""
        return (f"{where}: {dotted}: unknown key.\n  valid keys{scope}: {', '.join(valid)}\n"
                f"  fix: {hint}rename or remove the key.")
    if kind == "missing":
        return f"{where}: {dotted}: required key is missing.\n  fix: add `{loc[-1]}:` ({_field_help(loc)})."
    message = error["msg"].removeprefix("Value error, ")
    if kind not in ("value_error",) and "input" in error:
        message += f" (got {error['input']!r})"
    help_text = _field_help(loc)
    expected = f"\n  expected: {help_text}." if help_text else ""
    return f"{where}: {dotted}: {message}.{expected}"


def _check_consistency(spec: JobSpec) -> list[tuple[tuple, str]]:
    """Rules that span several keys; each is (key path, message with the fix)."""
    problems = []
    slurm = spec.slurm
    if spec.platform == "cpu" and (slurm.gpus_per_node or slurm.gres):
        key = "gpus_per_node" if slurm.gpus_per_node else "gres"
        problems.append((("slurm", key), "GPUs requested but platform is 'cpu'; set platform: gpu or remove it"))
    if slurm.gpus_per_node and slurm.gres:
        problems.append((("slurm", "gres"), "set either slurm.gpus_per_node or slurm.gres, not both"))
    needed = spec.processes_per_node * spec.devices_per_process
    if spec.platform == "gpu" and slurm.gpus_per_node and slurm.gpus_per_node < needed:
        problems.append((("slurm", "gpus_per_node"),
                         f"{slurm.gpus_per_node} GPUs per node cannot give {spec.processes_per_node} processes "
                         f"x {spec.devices_per_process} devices; request at least {needed}"))
    if spec.timeout and slurm.time and slurm.time < spec.timeout:
        problems.append((("slurm", "time"), "the Slurm time limit is shorter than timeout; raise it or lower timeout"))
    return problems


def validate_spec(data: Any, source: _Source) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source.path}: the spec must be a YAML mapping of keys such as name:, entrypoint:, nodes:")
    bad = [(p, label) for p, label in _forbidden_characters(data) if p[:1] != ("params",)]
    if bad:
        raise SpecError("\n".join(
            f"{source.locate(p)}: {'.'.join(map(str, p))}: contains {label}, which could end a line of the "
            f"batch script and run the rest as a command.\n  fix: write the value on one line."
            for p, label in bad))
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda e: source.line(tuple(e["loc"])))
        raise SpecError("\n".join(_describe(e, source) for e in errors)) from None
    problems = _check_consistency(spec)
    if problems:
        raise SpecError("\n".join(f"{source.locate(p)}: {'.'.join(p)}: {m}." for p, m in problems))
    return spec


def resolve_entrypoint(spec: JobSpec, spec_dir: Path, source: _Source) -> JobSpec:
    """Make a file entrypoint absolute (relative to the spec's folder) and check that it exists."""
    file = spec.entrypoint_file
    if file is None:
        return spec
    resolved = file if file.is_absolute() else (spec_dir / file).resolve()
    if not resolved.is_file():
        raise SpecError(f"{source.locate(('entrypoint',))}: entrypoint: file {str(file)!r} not found "
                        f"(looked for {resolved}).\n  fix: give the path relative to the spec's folder.")
    return spec.model_copy(update={"entrypoint": f"{resolved}:{spec.entrypoint.rpartition(':')[2]}"})


def load_spec(path: str | Path, overrides: list[str] = ()) -> JobSpec:
    """Read, override (`--set a.b=value`) and validate a job spec. Raises SpecError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file.\n  fix: check the path to the job spec.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"{path}{line}: not valid YAML: {exc.problem or exc}.\n"
                        f"  fix: check indentation and quoting on that line.") from None
    data = {} if data is None else data
    lines = _line_map(node, file=path) if node is not None else {(): 1}
    applied = {}
    for text_override in overrides:
        key_path, value = _parse_override(text_override)
        if not isinstance(data, dict):
            break  # validate_spec reports the real problem
        _apply_override(data, key_path, value, text_override)
        applied[key_path] = text_override
    source = _Source(path, lines, applied)
    spec = validate_spec(data, source)
    return resolve_entrypoint(spec, path.resolve().parent, source)
