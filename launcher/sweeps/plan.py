"""Declaring a sweep and expanding it: one spec, many validated configurations.

A sweep comes from the spec's `sweep:` section and from `--sweep KEY=V1,V2,...` flags (a flag
replaces the section's values for its key). Several keys give the cartesian product, the last key
changing fastest, as itertools.product and Hydra's multirun do:

    sweep:
      params.learning_rate: [0.05, 0.1]
      params.seed: range(0, 3)          # 0, 1, 2: Hydra's range(start, stop[, step]), stop excluded

Every configuration is validated as a whole spec before anything runs or is submitted, so a bad
value is refused with the configuration and the key named (exit code 2), not found an hour into
a job array.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from .. import yaml12
from ..errors import SpecError
from ..spec.load import SWEEP_SECTION, build_spec, parse_overrides, read_spec_file, shown
from ..spec.model import JobSpec

RANGE = re.compile(r"^\s*range\s*\((?P<args>[^()]*)\)\s*$")
# Keys that shape the sweep itself (or where its tasks live) cannot be swept.
NOT_SWEEPABLE = {(SWEEP_SECTION,), ("sweep_limit",), ("max_parallel",), ("run_dir",)}
MAX_ERRORS_SHOWN = 5


@dataclass(frozen=True)
class Configuration:
    index: int
    values: dict[str, Any]  # dotted key -> value, in the sweep's key order
    spec: JobSpec

    def label(self) -> str:
        return ", ".join(f"{key}={value!r}" for key, value in self.values.items())


@dataclass(frozen=True)
class Sweep:
    spec_path: Path
    base: JobSpec               # the spec with --set applied, before any swept value
    keys: list[str]             # dotted, in order
    configurations: list[Configuration]

    @property
    def name(self) -> str:
        return self.base.name

    def describe(self) -> str:
        """The configurations, one line each (what --dry-run shows)."""
        lines = [f"sweep of {len(self.configurations)} configurations over {', '.join(self.keys)}:"]
        lines += [f"  {c.index}: {c.label()}" for c in self.configurations]
        return "\n".join(lines)


def _split_top_level(text: str) -> list[str]:
    """'a,[1,2],"x,y"' -> ['a', '[1,2]', '"x,y"']: commas inside brackets or quotes stay."""
    items, depth, quote, current = [], 0, None, []
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return items


def _scalar(text: str, where: str) -> Any:
    """A value as --set reads it: YAML 1.2 (0.1 is a float, true a bool, abc a string)."""
    text = text.strip()
    if not text:
        raise SpecError(f"{where}: an empty value.\n  fix: remove the extra comma, or quote an empty string: ''.")
    try:
        return yaml12.load(text, lambda line, path: where).data
    except yaml12.YAMLSyntaxError:
        return text


def _number(text: str, where: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise SpecError(f"{where}: {text.strip()!r} is not a number.\n"
                        f"  fix: write range(start, stop[, step]) with numbers, e.g. range(0, 10, 2).") from None
    if not value.is_finite():
        raise SpecError(f"{where}: range bounds must be finite numbers.\n  fix: e.g. range(0, 1, 0.25).")
    return value


def expand_range(text: str, where: str, limit: int) -> list[int | float]:
    """range(start, stop[, step]) as Hydra reads it: stop excluded, floats allowed (exact
    decimal steps: range(0, 1, 0.1) gives 0.3, not 0.30000000000000004)."""
    args = [a for a in RANGE.match(text).group("args").split(",")]
    if len(args) not in (1, 2, 3):
        raise SpecError(f"{where}: {text.strip()}: range takes (stop), (start, stop) or (start, stop, step).\n"
                        f"  fix: e.g. range(0, 5) for 0, 1, 2, 3, 4.")
    numbers = [_number(a, where) for a in args]
    start, stop, step = (Decimal(0), numbers[0], Decimal(1)) if len(numbers) == 1 else \
        (numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else Decimal(1))
    if step == 0:
        raise SpecError(f"{where}: {text.strip()}: the step is 0.\n  fix: give a step that is not 0.")
    count = max(0, int(((stop - start) / step).to_integral_value(rounding=ROUND_CEILING)))
    if count == 0:
        raise SpecError(f"{where}: {text.strip()} is empty (stop is excluded).\n"
                        f"  fix: make stop larger than start (or the step negative).")
    if count > limit:
        raise SpecError(f"{where}: {text.strip()} has {count} values, more than sweep_limit ({limit}).\n"
                        f"  fix: use a larger step, or raise sweep_limit on purpose.")
    integral = all(n == n.to_integral_value() for n in numbers) and not any("." in a or "e" in a.lower()
                                                                             for a in args)
    values = [start + i * step for i in range(count)]
    return [int(v) if integral else float(v) for v in values]


def parse_values(raw: Any, where: str, limit: int) -> list:
    """The values of one swept key: a list, 'V1,V2,...', or 'range(...)'."""
    if isinstance(raw, str) and RANGE.match(raw):
        values = expand_range(raw, where, limit)
    elif isinstance(raw, list):
        values = raw
    elif isinstance(raw, str):
        values = [_scalar(item, where) for item in _split_top_level(raw)]
    else:
        raise SpecError(f"{where}: {raw!r} is a single value; a swept key needs several.\n"
                        f"  fix: write a list, e.g. [0.1, 0.01], or range(start, stop[, step]).")
    if not values:
        raise SpecError(f"{where}: no values.\n  fix: give at least one value to sweep over.")
    seen = []
    for value in values:
        if any(type(value) is type(other) and value == other for other in seen):
            raise SpecError(f"{where}: {value!r} is listed twice, which would run one configuration twice.\n"
                            f"  fix: remove the duplicate.")
        seen.append(value)
    return values


def _key_path(key: str, where: str) -> tuple:
    path = tuple(part.strip() for part in key.strip().split("."))
    if not key.strip() or not all(path):
        raise SpecError(f"{where}: {key!r} is not a key.\n"
                        f"  fix: name a spec key with dots between names, e.g. params.learning_rate.")
    if path[:1] in NOT_SWEEPABLE or path in NOT_SWEEPABLE:
        raise SpecError(f"{where}: {yaml12.dotted(path)} cannot be swept (it shapes the sweep itself).\n"
                        f"  fix: set it once, with --set or in the spec.")
    return path


def _flatten(section: dict, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """`{params: {lr: [..]}}` and `{params.lr: [..]}` both mean the key params.lr."""
    items = []
    for key, value in section.items():
        path = prefix + tuple(str(key).split("."))
        if isinstance(value, dict):
            items += _flatten(value, path)
        else:
            items.append((path, value))
    return items


def _declared(data: Any, lines: dict, spec_path: Path, sweep_flags: list[str], limit: int) -> dict:
    """key path -> (values, where they were declared), the flags replacing the section per key."""
    declared: dict[tuple, tuple[list, str]] = {}
    section = data.get(SWEEP_SECTION) if isinstance(data, dict) else None
    if section is not None:
        line = lines.get((SWEEP_SECTION,))
        if not isinstance(section, dict):
            raise SpecError(f"{spec_path}:{line}: sweep: expected a mapping of keys to values, e.g.\n"
                            f"    sweep:\n      params.learning_rate: [0.1, 0.01]\n"
                            f"  fix: list each swept key under sweep:.")
        for path, raw in _flatten(section):
            dotted = ".".join(path)
            key_line = lines.get((SWEEP_SECTION, dotted)) or lines.get((SWEEP_SECTION, *path)) or line
            where = f"{spec_path}:{key_line}: sweep: {dotted}"
            _key_path(dotted, where)
            declared[path] = (parse_values(raw, where, limit), f"{spec_path}:{key_line}")
    for flag in sweep_flags:
        key, sep, raw = flag.partition("=")
        where = f"--sweep {shown(flag)}"
        if not sep:
            raise SpecError(f"{where}: expected KEY=V1,V2,..., e.g. --sweep params.seed=0,1,2 or "
                            f"--sweep params.seed='range(0,3)'.")
        path = _key_path(key, where)
        declared[path] = (parse_values(raw, where, limit), where)
    return declared


def load_job_or_sweep(spec_path: str | Path, overrides: list[str] = (), sweep_flags: list[str] = (),
                      program_args: list[str] = ()) -> JobSpec | Sweep:
    """What `run` and `submit` run, from one read of the spec file: the sweep the spec and flags
    declare, every configuration validated, or else the one JobSpec. Raises SpecError; for a
    sweep, naming the configuration and key of every invalid one (the first few)."""
    spec_path = Path(spec_path)
    loaded = read_spec_file(spec_path)
    data = {} if loaded.data is None else loaded.data
    parsed_overrides = parse_overrides(overrides)
    if not sweep_flags and not (isinstance(data, dict) and SWEEP_SECTION in data):
        return build_spec(spec_path, data, loaded.lines, parsed_overrides, program_args=program_args)
    base_data = {k: v for k, v in data.items() if k != SWEEP_SECTION} if isinstance(data, dict) else data
    base = build_spec(spec_path, base_data, loaded.lines, parsed_overrides, program_args=program_args)
    declared = _declared(data, loaded.lines, spec_path, list(sweep_flags), base.sweep_limit)
    for key_path, _, text in parsed_overrides:
        if key_path in declared:
            raise SpecError(f"--set {shown(text)}: {yaml12.dotted(key_path)} is also swept ({declared[key_path][1]}).\n"
                            f"  fix: drop the --set, or the sweep of that key.")
    keys = list(declared)
    total = 1
    for values, _ in declared.values():
        total *= len(values)
    if total > base.sweep_limit:
        sizes = " x ".join(f"{len(v)} ({yaml12.dotted(k)})" for k, (v, _) in declared.items())
        raise SpecError(f"{spec_path}: the sweep has {total} configurations ({sizes}), more than sweep_limit "
                        f"({base.sweep_limit}).\n  fix: sweep fewer values, or raise sweep_limit on purpose "
                        f"(--set sweep_limit={total}).")
    configurations, errors = [], {}  # error text -> labels of the configurations that hit it
    for index, combination in enumerate(itertools.product(*(values for values, _ in declared.values()))):
        values = dict(zip(keys, combination))
        labels = {path: f"sweep {yaml12.dotted(path)}={shown(repr(value), 40)} ({declared[path][1]})"
                  for path, value in values.items()}
        dotted_values = {yaml12.dotted(path): value for path, value in values.items()}
        try:
            spec = build_spec(spec_path, base_data, loaded.lines, parsed_overrides, values, labels, program_args)
        except SpecError as error:
            label = ", ".join(f"{k}={v!r}" for k, v in dotted_values.items())
            errors.setdefault(str(error), []).append(f"configuration {index} of {total} ({label})")
            continue
        configurations.append(Configuration(index, dotted_values, spec))
    if errors:
        shown_errors = []
        for text, which in list(errors.items())[:MAX_ERRORS_SHOWN]:
            others = f" and {len(which) - 1} more with the same error" if len(which) > 1 else ""
            shown_errors.append(f"{which[0]}{others}:\n  " + text.replace("\n", "\n  "))
        more = f"\n(and {len(errors) - MAX_ERRORS_SHOWN} more errors)" if len(errors) > MAX_ERRORS_SHOWN else ""
        raise SpecError("the sweep has invalid configurations; nothing was run or submitted.\n"
                        + "\n".join(shown_errors) + more)
    return Sweep(spec_path, base, [yaml12.dotted(k) for k in keys], configurations)
