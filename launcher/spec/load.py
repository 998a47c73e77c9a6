"""Loading a job spec: read the YAML, apply --set overrides, check it against the typed model
(model.py), and resolve the entrypoint and run directory. Errors name the file, the line, the key
path and the fix, so a user never has to read a traceback to find a typo.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from .. import yaml12
from ..errors import SpecError
from .fields import InvalidRecord, Optional, Problem, Record, Section
from .entrypoint import resolve_entrypoint
from .model import ENTRYPOINT_KINDS, SPEC_KEYS, JobSpec

FORBIDDEN_CHARACTERS = {"\n": "a newline", "\r": "a carriage return", "\0": "a NUL byte"}


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
        if key_path and key_path not in self.lines and key_path not in self.labels:
            for key, text in self.overrides.items():  # --set a.b=1 where `a` itself is the problem
                if key[:len(key_path)] == key_path:
                    return f"--set {shown(text)}"
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
        back = JobSpec.from_json(spec.to_json().encode("utf-8"))
    except Exception as exc:  # noqa: BLE001  (any failure here would otherwise happen after the run started)
        raise SpecError(f"{source.path}: the spec cannot be written to spec.json: {exc}.\n"
                        f"  fix: keep to strings, numbers, booleans, lists and mappings.") from None
    written, read = spec.to_dict(), back.to_dict()
    for key in written:
        if not _same(written[key], read[key]):
            raise SpecError(f"{source.locate((key,))}: {key}: would not reach the job unchanged through "
                            f"spec.json.\n  fix: keep to strings, numbers, booleans, lists and mappings.")


def _field_help(key_path: tuple) -> str:
    record, info = JobSpec, None
    for key in key_path:
        if record is None or key not in record.fields():
            break
        info = record.fields()[key]
        kind = info.kind.inner if isinstance(info.kind, Optional) else info.kind  # `container:` may be null
        record = kind.record if isinstance(kind, Section) else None
    return info.description if info is not None else ""


def _describe(problem: Problem, source: _Source) -> str:
    loc = problem.loc
    where = source.locate(loc)
    dotted = ".".join(map(str, loc)) or "(top level)"
    if problem.kind == "unknown_key" and loc == (SWEEP_SECTION,) and where.startswith("--set"):
        # `sweep` is a key of the file, so "did you mean 'sweep'?" would send the user in a circle
        return (f"{where}: {dotted}: a sweep cannot be set with --set.\n"
                f"  fix: sweep a key with --sweep KEY=V1,V2,... (for example --sweep params.lr=0.1,0.01), or write "
                f"a `sweep:` section in the spec file.")
    if problem.kind == "unknown_key":
        section: type[Record] | None = SPEC_KEYS.get(loc[:-1])
        valid = sorted([*section.fields(), *([SWEEP_SECTION] if section is JobSpec else [])]) if section else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        scope = f" under {'.'.join(map(str, loc[:-1]))}" if len(loc) > 1 else ""
        return (f"{where}: {dotted}: unknown key.\n  valid keys{scope}: {', '.join(valid)}\n"
                f"  fix: {hint}rename or remove the key.")
    if problem.kind == "missing":
        return f"{where}: {dotted}: required key is missing.\n  fix: add `{loc[-1]}:` ({_field_help(loc)})."
    help_text = _field_help(loc)
    expected = f"\n  expected: {help_text}." if help_text else ""
    return f"{where}: {dotted}: {problem.message}.{expected}"


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
    if spec.container is not None and spec.container.runtime == "pyxis" and slurm.launch != "srun":
        problems.append((("container", "runtime"),
                         "pyxis starts containers only through srun: in mpirun mode mpirun would run inside one "
                         "pyxis container and cannot start ranks on the other nodes (NVIDIA/pyxis#164); "
                         "set slurm.launch: srun"))
    if spec.transport == "xla" and not spec.jax_distributed:
        problems.append((("transport",), "XLA's collectives run over JAX's multi-process runtime; set "
                                         "jax_distributed: true, or transport: mpi4jax (or auto)"))
    if spec.args and not spec.runs_program:  # also `-- ARG...`: it would be dropped without a word
        problems.append((("args",), f"args are a script's or module's argv, and the entrypoint {spec.entrypoint!r} "
                                    f"is a function: it gets ctx.params instead; pass the values in params, or "
                                    f"make the entrypoint a script"))
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
        spec = JobSpec.from_dict(data)
    except InvalidRecord as exc:
        problems = sorted(exc.problems, key=lambda p: source.line(p.loc))
        raise SpecError("\n".join(_describe(p, source) for p in problems)) from None
    problems = _check_consistency(spec)
    if problems:
        raise SpecError("\n".join(f"{source.locate(p)}: {'.'.join(p)}: {m}." for p, m in problems))
    return spec


def resolve_run_dir(spec: JobSpec, spec_dir: Path) -> JobSpec:
    """A spec's relative run_dir is relative to the spec's folder, like its entrypoint file (the
    --run-dir flag, by contrast, is relative to the working directory)."""
    if spec.run_dir is None or Path(spec.run_dir).is_absolute():
        return spec
    return spec.replace(run_dir=str(spec_dir / spec.run_dir))


def resolve_image(spec: JobSpec, spec_dir: Path) -> JobSpec:
    """A relative image path is relative to the spec's folder, like the entrypoint file and run_dir.
    Registry names (pyxis, apptainer's docker://...) are not paths and stay as written."""
    container = spec.container
    if container is None or container.runtime == "pyxis" or "://" in container.image \
            or Path(container.image).is_absolute():
        return spec
    return spec.replace(container=container.replace(image=str(spec_dir / container.image)))


def describe_spec(spec: JobSpec) -> str:
    """Every resolved value of the spec, one per line with its type (`params.lr = 0.001  (float)`),
    so a user can see what the file, the defaults and each --set produced."""
    durations = {("timeout",), ("collective_timeout",), ("hang_timeout",), ("jax_distributed_timeout",), ("slurm", "time"),
                 ("slurm", "checkpoint_notice")}
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
            if path in durations and isinstance(value, int):
                kind += ", seconds"
            if path == ("entrypoint",):  # which of the four kinds the check read
                kind += f"; {spec.entrypoint_kind}: {ENTRYPOINT_KINDS[spec.entrypoint_kind]}"
            lines.append(f"{label} = {value!r}  ({kind})")

    walk(spec.to_dict(), (), "")
    return "\n".join(lines)


SWEEP_SECTION = "sweep"


def script_as_spec(path: Path) -> "yaml12.Loaded":
    """The spec a script given where SPEC goes stands for (`jaxlaunch run train.py -- --lr 0.1`):
    every key at its default, the script as the entrypoint, named after the file."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem)[:64].lstrip("._-") or "job"
    return yaml12.Loaded({"name": name, "entrypoint": path.name}, {})


# `jaxlaunch run -m MODULE` names its spec MODULE + this suffix: a module to run as `python -m`
# does, with a spec of defaults (module_as_spec). No file is read.
MODULE_SUFFIX = ".python-module"


def module_as_spec(module: str) -> "yaml12.Loaded":
    """The spec `-m MODULE` stands for: every key at its default, the module as the entrypoint."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", module.rpartition(".")[2])[:64].lstrip("._-") or "job"
    return yaml12.Loaded({"name": name, "entrypoint": module}, {})


def read_spec_file(path: Path) -> "yaml12.Loaded":
    """The spec file's YAML value (None for an empty file) and the line of every key. A .py file
    is a script to run with a spec of defaults (script_as_spec); MODULE + MODULE_SUFFIX a module."""
    if path.suffix == ".py":
        return script_as_spec(path)
    if path.name.endswith(MODULE_SUFFIX):
        return module_as_spec(path.name[:-len(MODULE_SUFFIX)])
    try:
        size = path.stat().st_size
        if size > yaml12.MAX_BYTES:
            raise SpecError(f"{path}: {size} bytes; the limit is {yaml12.MAX_BYTES} bytes.\n"
                            f"  fix: keep data out of the spec: put it in a file and pass its path in params.")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        module = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", str(path)) and not path.suffix
        hint = (f" To run the module {path} as `python -m {path}` does: jaxlaunch run -m {path} ..." if module
                else "")
        raise SpecError(f"{path}: no such file.\n  fix: check the path to the job spec.{hint}") from None
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
               values: dict[tuple, Any] | None = None, labels: dict[tuple, str] | None = None,
               program_args: list[str] = ()) -> JobSpec:
    """Apply --set overrides, then `values` (a sweep configuration's, located by `labels`), to a
    copy of the spec file's data, append `program_args` (`-- ARG...`) to its args, and validate.
    Raises SpecError."""
    import copy

    data = copy.deepcopy(data)
    if program_args and isinstance(data, dict) and isinstance(data.get("args", []), list):
        data["args"] = [*data.get("args", []), *program_args]  # a wrong `args:` is validate_spec's to report
        if ("args",) not in lines:  # a problem with them is located where they were given: after `--`
            import shlex

            labels = {**(labels or {}), ("args",): f"-- {shlex.join(program_args)}"}
    applied = {}
    for key_path, value, text in overrides:
        if not isinstance(data, dict):
            break  # validate_spec reports the real problem
        # a copy: an override's value is shared by every configuration of a sweep, and a swept
        # key inside it (--set params.opt={lr: 1} --sweep params.opt.lr=...) must not write into it
        _apply_override(data, key_path, copy.deepcopy(value), text)
        applied[key_path] = text
    for key_path, value in (values or {}).items():
        if isinstance(data, dict):
            _apply_override(data, key_path, value, (labels or {}).get(key_path, yaml12.dotted(key_path)))
    source = _Source(path, lines, applied, labels)
    spec = validate_spec(data, source)
    spec_dir = path.resolve().parent
    spec = resolve_entrypoint(spec, spec_dir, source.locate(("entrypoint",)))
    spec = resolve_run_dir(spec, spec_dir)
    spec = resolve_image(spec, spec_dir)
    _check_serialisable(spec, source)
    return spec


def load_spec(path: str | Path, overrides: list[str] = (), allow_sweep: bool = False,
              program_args: list[str] = ()) -> JobSpec:
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
    return build_spec(path, data, loaded.lines, parse_overrides(overrides), program_args=list(program_args))
