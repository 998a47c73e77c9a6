"""The job spec: one typed object, loaded from YAML and validated once.

Everything after `load_spec` trusts the JobSpec it gets. Errors name the file, the line, the
key path and the fix, so a user never has to read a traceback to find a typo.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

# jaxlaunch's models use no pydantic plugins: skip pydantic's scan of every installed package's
# entry points while they are built (~40 ms of every command). Restored after the models.
_PLUGINS_SETTING = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator  # noqa: E402

from . import yaml12
from .errors import SpecError

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MODULE_ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
RUN_DIR_PLACEHOLDERS = ("{name}", "{time}")
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
    # inf/nan as JSON's NaN/Infinity constants in spec.json: the default would turn them into null.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, ser_json_inf_nan="constants")


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
    max_requeues: int = Field(
        3, ge=0, description="requeues after a preemption or time-limit notice (counted apart in status); "
                             "once spent the job ends FAILED"
    )
    checkpoint_notice: Duration = Field(
        90, description="how long before the time limit Slurm warns the job (sbatch --signal=B:USR2@...), so "
                        "it can checkpoint and requeue: seconds, '2m', ..."
    )
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
        None, description="run directory, relative to the spec's folder; may use {name} and {time}; "
                          "default runs/{name}-{time} in the working directory"
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
    keep_checkpoints: int = Field(
        2, ge=1, description="how many of the newest checkpoints ctx.checkpoints keeps in RUN_DIR/checkpoints"
    )
    max_parallel: int | None = Field(
        None, ge=1, description="sweeps: configurations running at once (Slurm --array %M; locally default 1); "
                                "--max-parallel overrides it"
    )
    sweep_limit: int = Field(
        1000, ge=1, description="sweeps: the most configurations a sweep may expand to, so a typo cannot submit "
                                "a million jobs; raise it on purpose"
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

    @field_validator("run_dir")
    @classmethod
    def _known_placeholders(cls, value):
        if value is None:
            return value
        unknown = sorted(set(re.findall(r"\{[^{}]*\}", value)) - set(RUN_DIR_PLACEHOLDERS))
        stray = re.sub(r"\{[^{}]*\}", "", value)
        if unknown:
            raise ValueError(f"{unknown[0]} is not a placeholder; valid: {', '.join(RUN_DIR_PLACEHOLDERS)}")
        if "{" in stray or "}" in stray:
            raise ValueError(f"{value!r} has an unmatched brace; placeholders are {', '.join(RUN_DIR_PLACEHOLDERS)}")
        if not value.strip():
            raise ValueError("the run directory is empty")
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

if _PLUGINS_SETTING is None:
    del os.environ["PYDANTIC_DISABLE_PLUGINS"]
else:
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = _PLUGINS_SETTING


# --- loading -------------------------------------------------------------------------------

def shown(text: str, limit: int = 80) -> str:
    """A --set override as messages show it: long ones shortened."""
    return text if len(text) <= limit else text[:limit - 20] + f"...({len(text) - limit + 20} more)"


class _Source:
    """Where each key of the spec came from: a line of the file, or a --set override."""

    def __init__(self, path: Path, lines: dict[tuple, int], overrides: dict[tuple, str],
                 labels: dict[tuple, str] | None = None):
        self.path, self.lines, self.overrides = path, lines, overrides
        self.labels = labels or {}  # key path -> where its value came from, e.g. a sweep's value

    def line(self, key_path: tuple) -> int:
        """For sorting errors in file order; --set overrides come last."""
        for n in range(len(key_path), -1, -1):
            if tuple(key_path[:n]) in self.overrides or tuple(key_path[:n]) in self.labels:
                return 1 << 30
            if tuple(key_path[:n]) in self.lines:
                return self.lines[tuple(key_path[:n])]
        return 0

    def locate(self, key_path: tuple) -> str:
        for n in range(len(key_path), -1, -1):
            prefix = tuple(key_path[:n])
            if prefix in self.labels:
                return self.labels[prefix]
            if prefix in self.overrides:
                return f"--set {shown(self.overrides[prefix])}"
            if prefix in self.lines:
                return f"{self.path}:{self.lines[prefix]}"
        return str(self.path)


def _parse_override(text: str) -> tuple[tuple, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set {shown(text)}: expected KEY=VALUE, e.g. --set nodes=2 or --set slurm.partition=gpu")
    bad = [label for char, label in FORBIDDEN_CHARACTERS.items() if char in raw]
    if bad and not key.strip().startswith("params."):
        raise SpecError(f"--set {shown(key.strip())}=...: contains {bad[0]}, which could end a line of the batch "
                        f"script and run the rest as a command.\n  fix: write the value on one line.")
    key_path = tuple(part.strip() for part in key.strip().split("."))
    if not all(key_path):
        raise SpecError(f"--set {shown(text)}: the key {shown(key.strip())!r} has an empty part.\n"
                        f"  fix: name the key with dots between names, e.g. --set slurm.partition=gpu")
    if len(key_path) > yaml12.MAX_DEPTH:
        raise SpecError(f"--set {shown(text)}: the key is nested more than {yaml12.MAX_DEPTH} levels deep.\n"
                        f"  fix: flatten the structure; a spec does not need this depth.")
    if not raw.strip():
        return key_path, ""

    def where(line, path):
        return f"--set {shown(text)}: {yaml12.dotted(key_path + path)}"
    try:
        value = yaml12.load(raw, where).data
    except yaml12.YAMLSyntaxError:
        value = raw  # not YAML (e.g. an unclosed bracket): take the text as it is
    return key_path, value


def _apply_override(data: dict, key_path: tuple, value: Any, text: str) -> None:
    target = data
    for key in key_path[:-1]:
        child = target.get(key)
        if child is None:
            child = target[key] = {}
        if not isinstance(child, dict):
            raise SpecError(f"--set {shown(text)}: {key!r} is not a section, so it has no key {key_path[-1]!r}.\n"
                           f"  fix: check the key path: {key!r} holds a value, not keys.")
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


def _unwritable(data):
    """(path, problem) for what spec.json or the batch script could not hold: lone surrogates (not
    valid Unicode; they reach Python through --set from undecodable bytes or through YAML's "\\ud800"
    escapes) and nesting deeper than the loader allows. Iterative: `data` may be deep."""
    pending = [((), data, 1)]
    while pending:
        path, value, depth = pending.pop()
        if isinstance(value, (dict, list)) and depth > yaml12.MAX_DEPTH:
            yield path, f"nested more than {yaml12.MAX_DEPTH} levels deep", "flatten the structure"
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(key, str) and _surrogate(key):
                yield path + (key,), f"the key contains {_surrogate(key)}", "rename the key"
            pending.append((path + (key,), item, depth + 1))
        if isinstance(value, str) and _surrogate(value):
            yield path, (f"contains {_surrogate(value)}, which cannot be written as UTF-8 (to spec.json or the "
                         f"batch script)"), ("remove it; from --set, check the shell's quoting and the terminal's "
                                             "encoding")


def _surrogate(text: str) -> str:
    try:
        text.encode("utf-8")
        return ""
    except UnicodeEncodeError as exc:
        return f"a lone surrogate (U+{ord(text[exc.start]):04X}, not valid Unicode)"


def _same(a, b) -> bool:
    """Equality where NaN equals NaN and types must match (spec.json must give the ranks the same values)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _check_serialisable(spec: JobSpec, source: _Source) -> None:
    """spec.json is what every rank reads: it must be writable and give back the same values."""
    try:
        back = JobSpec.model_validate_json(spec.model_dump_json().encode("utf-8"))
    except Exception as exc:  # noqa: BLE001  (any failure here would otherwise happen after the run started)
        raise SpecError(f"{source.path}: the spec cannot be written to spec.json: {exc}.\n"
                        f"  fix: keep to strings, numbers, booleans, lists and mappings.") from None
    for key in type(spec).model_fields:
        if not _same(getattr(spec, key) if key != "slurm" else spec.slurm.model_dump(),
                     getattr(back, key) if key != "slurm" else back.slurm.model_dump()):
            raise SpecError(f"{source.locate((key,))}: {key}: would not reach the job unchanged through "
                            f"spec.json.\n  fix: keep to strings, numbers, booleans, lists and mappings.")


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
        valid = sorted([*section.model_fields, *([SWEEP_SECTION] if section is JobSpec else [])]) if section else []
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
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
            type(data), type(data).__name__)
        raise SpecError(f"{source.path}:1: the spec must be a YAML mapping of keys such as name:, entrypoint:, "
                        f"nodes:, not {kind}.\n  fix: write one `key: value` per line, e.g. `name: myjob`.")
    unwritable = list(_unwritable(data))
    if unwritable:
        raise SpecError("\n".join(f"{source.locate(p)}: {yaml12.dotted(p)}: {problem}.\n  fix: {fix}."
                                  for p, problem, fix in unwritable))
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


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool]:
    """Names a module binds at its top level (also inside if/try/with/for blocks), and whether it
    may bind others we cannot see (`from x import *`, a module `__getattr__`)."""
    names, open_ended = set(), False
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            open_ended |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                open_ended |= alias.name == "*"
                names.add(alias.asname or alias.name.partition(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for block in ("body", "orelse", "finalbody"):
                pending += getattr(node, block, [])
            for handler in getattr(node, "handlers", []):
                pending += handler.body
        elif hasattr(ast, "TryStar") and isinstance(node, ast.TryStar):
            pending += node.body + node.orelse + node.finalbody
    return names, open_ended


def _check_defines(file: Path, function: str, where: str, entrypoint: str) -> None:
    """The job's source must define `function` at its top level. Parsed with ast, never run."""
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as exc:
        raise SpecError(f"{where}: entrypoint: {file}:{exc.lineno}: the job's code has a syntax error "
                        f"({exc.msg}).\n  fix: correct the job's code; it would fail as soon as a rank "
                        f"imports it.") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{where}: entrypoint: cannot read {file}: {exc}.\n"
                        f"  fix: check the file and its permissions.") from None
    names, open_ended = _top_level_names(tree)
    if function in names or open_ended:
        return
    defined = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    close = difflib.get_close_matches(function, defined, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SpecError(f"{where}: entrypoint: {file} defines no top-level {function!r} "
                    f"(functions there: {', '.join(defined) or 'none'}).\n"
                    f"  fix: {hint}write the entrypoint as '{entrypoint.rpartition(':')[0]}:FUNCTION' with a "
                    f"function defined at the top level of that file.")


def _find_module(name: str, search: list[str]):
    """The import spec of `name` on the search path, found without importing anything: the
    standard importlib.util.find_spec imports a dotted name's parent packages, which would run the
    job's code. Returns None when not found."""
    from importlib.machinery import PathFinder

    parts = name.split(".")
    path = search
    found = None
    for depth in range(len(parts)):
        found = PathFinder.find_spec(".".join(parts[:depth + 1]), path)
        if found is None:
            return None
        if depth < len(parts) - 1:
            path = found.submodule_search_locations
            if not path:
                return None  # a module, not a package: it has no submodules
    return found


def resolve_entrypoint(spec: JobSpec, spec_dir: Path, source: _Source) -> JobSpec:
    """Check that the entrypoint's file or module exists and defines the function, without running
    any of the job's code. A file is made absolute (relative to the spec's folder)."""
    where = source.locate(("entrypoint",))
    target, _, function = spec.entrypoint.rpartition(":")
    file = spec.entrypoint_file
    if file is not None:
        resolved = file if file.is_absolute() else spec_dir / file
        try:
            resolved = resolved.resolve()
            exists = resolved.is_file()
        except (OSError, RuntimeError, ValueError) as exc:
            raise SpecError(f"{where}: entrypoint: cannot use the file name {str(file)[:80]!r}: "
                            f"{getattr(exc, 'strerror', None) or exc}.\n"
                            f"  fix: give the path of the job's .py file relative to the spec's folder.") from None
        if not exists:
            raise SpecError(f"{where}: entrypoint: file {str(file)!r} not found (looked for {resolved}).\n"
                            f"  fix: give the path relative to the spec's folder.")
        _check_defines(resolved, function, where, spec.entrypoint)
        return spec.model_copy(update={"entrypoint": f"{resolved}:{function}"})
    # A module: the ranks import it with the working directory first on sys.path (plus any
    # PYTHONPATH the spec's env sets), so that is where it must be found.
    extra = [p for p in spec.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    search = [os.getcwd(), *extra, *sys.path]
    importlib.invalidate_caches()  # a module written a moment ago must be seen
    try:
        found = None if target in sys.builtin_module_names else _find_module(target, search)
        in_spec_dir = found is None and target not in sys.builtin_module_names and \
            _find_module(target, [str(spec_dir)]) is not None
    except (ImportError, OSError, ValueError) as exc:
        raise SpecError(f"{where}: entrypoint: cannot look up module {target!r}: {exc}.\n"
                        f"  fix: check the module name.") from None
    if found is None and target not in sys.builtin_module_names:
        if in_spec_dir:
            raise SpecError(
                f"{where}: entrypoint: module {target!r} is in the spec's folder ({spec_dir}), but the ranks "
                f"import modules from the working directory ({os.getcwd()}).\n"
                f"  fix: run jaxlaunch from {spec_dir}, or name the file: "
                f"'{target.replace('.', '/')}.py:{function}'.")
        raise SpecError(f"{where}: entrypoint: module {target!r} not found (looked in {os.getcwd()} and "
                        f"the Python path).\n  fix: run jaxlaunch from the folder that holds the package, "
                        f"install it, or write the entrypoint as 'path/to/file.py:{function}'.")
    origin = getattr(found, "origin", None)
    if origin and origin.endswith(".py") and Path(origin).is_file():
        _check_defines(Path(origin), function, where, spec.entrypoint)
    return spec


def resolve_run_dir(spec: JobSpec, spec_dir: Path) -> JobSpec:
    """A spec's relative run_dir is relative to the spec's folder, like its entrypoint file (the
    --run-dir flag, by contrast, is relative to the working directory)."""
    if spec.run_dir is None or Path(spec.run_dir).is_absolute():
        return spec
    return spec.model_copy(update={"run_dir": str(spec_dir / spec.run_dir)})


def describe_spec(spec: JobSpec) -> str:
    """Every resolved value of the spec, one per line with its type (`params.lr = 0.001  (float)`),
    so a user can see what the file, the defaults and each --set produced."""
    durations = {("timeout",), ("collective_timeout",), ("slurm", "time"), ("slurm", "checkpoint_notice")}
    names = {str: "str", int: "int", float: "float", bool: "bool", type(None): "null", list: "list", dict: "dict"}
    lines = []

    def walk(value, path, label):
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, path + (key,), f"{label}.{key}" if label else str(key))
        elif isinstance(value, list) and value:
            for index, item in enumerate(value):
                walk(item, path + (index,), f"{label}[{index}]")
        else:
            kind = names.get(type(value), type(value).__name__)
            if path in durations and value is not None:
                kind += ", seconds"
            lines.append(f"{label} = {value!r}  ({kind})")

    walk(spec.model_dump(), (), "")
    return "\n".join(lines)


SWEEP_SECTION = "sweep"


def read_spec_file(path: Path) -> "yaml12.Loaded":
    """The spec file's YAML value (None for an empty file) and the line of every key."""
    try:
        size = path.stat().st_size
        if size > yaml12.MAX_BYTES:
            raise SpecError(f"{path}: {size} bytes; the limit is {yaml12.MAX_BYTES} bytes.\n"
                            f"  fix: keep data out of the spec: put it in a file and pass its path in params.")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file.\n  fix: check the path to the job spec.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc}") from None

    def where(line, key_path):
        located = f"{path}:{line}" if line else str(path)
        return f"{located}: {yaml12.dotted(key_path)}" if key_path else located
    return yaml12.load(text, where)


def parse_overrides(overrides) -> list[tuple[tuple, Any, str]]:
    """(key path, value, the text as typed) for each --set KEY=VALUE."""
    return [(*_parse_override(text), text) for text in overrides]


def build_spec(path: Path, data: Any, lines: dict[tuple, int], overrides: list[tuple[tuple, Any, str]] = (),
               values: dict[tuple, Any] | None = None, labels: dict[tuple, str] | None = None) -> JobSpec:
    """Apply --set overrides, then `values` (a sweep configuration's, located by `labels`), to a
    copy of the spec file's data, and validate. Raises SpecError."""
    import copy

    data = copy.deepcopy(data)
    applied = {}
    for key_path, value, text in overrides:
        if not isinstance(data, dict):
            break  # validate_spec reports the real problem
        _apply_override(data, key_path, value, text)
        applied[key_path] = text
    for key_path, value in (values or {}).items():
        if isinstance(data, dict):
            _apply_override(data, key_path, value, (labels or {}).get(key_path, yaml12.dotted(key_path)))
    source = _Source(path, lines, applied, labels)
    spec = validate_spec(data, source)
    spec_dir = path.resolve().parent
    spec = resolve_entrypoint(spec, spec_dir, source)
    spec = resolve_run_dir(spec, spec_dir)
    _check_serialisable(spec, source)
    return spec


def load_spec(path: str | Path, overrides: list[str] = (), allow_sweep: bool = False) -> JobSpec:
    """Read, override (`--set a.b=value`) and validate a job spec. Raises SpecError.

    A spec with a `sweep:` section describes many jobs: commands that run one job refuse it,
    unless `allow_sweep` (then the section is ignored: the spec without its swept values)."""
    path = Path(path)
    loaded = read_spec_file(path)
    data = {} if loaded.data is None else loaded.data
    if isinstance(data, dict) and SWEEP_SECTION in data:
        if not allow_sweep:
            line = loaded.lines.get((SWEEP_SECTION,))
            raise SpecError(f"{path}{f':{line}' if line else ''}: sweep: this spec is a sweep (many "
                            f"configurations); this command takes one.\n  fix: use `jaxlaunch run` or `jaxlaunch "
                            f"submit`, which run every configuration, or pin the swept keys with --set.")
        data = {k: v for k, v in data.items() if k != SWEEP_SECTION}
    return build_spec(path, data, loaded.lines, parse_overrides(overrides))
