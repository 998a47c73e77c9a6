"""Typed records for the job spec: frozen dataclasses whose fields declare a kind (their type and
range), a default and a description.

`Record.from_dict` checks a mapping (the YAML file's, after --set) against the fields and reports
every problem at once, each with its key path, as a list of `Problem`s that the loader turns into
file:line messages. Making a record directly (`JobSpec(name=..., ...)`, `spec.replace(...)`) runs the
same checks, so no JobSpec holds a wrong value.

Why not pydantic, which did this before: importing it and building the two models cost ~0.15 s in
every command, a third of `jaxlaunch submit` (whose target is 0.3 s over a bare sbatch), for two flat
sections of scalars, lists and mappings. What the spec needs is here: strict types (no "2" for 2,
no true for 1), ranges, choices, durations, unknown and missing keys, per-field checks.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from typing import Any, Callable

REQUIRED = dataclasses.MISSING


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where (key path), what kind, and the message."""

    loc: tuple
    kind: str  # "unknown_key", "missing" or "invalid"
    message: str


class InvalidRecord(ValueError):
    """The input does not fit the record; `problems` lists everything wrong, not just the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(f"{'.'.join(map(str, p.loc)) or '(top level)'}: {p.message}"
                                   for p in problems))


def shown_value(value: Any, limit: int = 80) -> str:
    """A value as messages quote it: its repr, shortened when long."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 20] + f"...({len(text) - limit + 20} more)"


class Kind:
    """The type of a field's value. `check` returns the value (normalised, e.g. a duration in
    seconds) or appends Problems and returns it unchanged."""

    def check(self, value: Any, loc: tuple, problems: list[Problem]) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        """The type in words, for the generated spec reference (docs/reference/spec.md)."""
        return "any value"

    @staticmethod
    def wrong(loc, problems, expected, value):
        problems.append(Problem(loc, "invalid", f"expected {expected} (got {shown_value(value)})"))
        return value


class Text(Kind):
    describe = staticmethod(lambda: "string")

    def check(self, value, loc, problems):
        return value if isinstance(value, str) else self.wrong(loc, problems, "a string", value)


class Boolean(Kind):
    describe = staticmethod(lambda: "boolean")

    def check(self, value, loc, problems):
        return value if isinstance(value, bool) else self.wrong(loc, problems, "true or false", value)


class Integer(Kind):
    def __init__(self, minimum: int | None = None):
        self.minimum = minimum

    def describe(self):
        return "integer" if self.minimum is None else f"integer, at least {self.minimum}"

    def check(self, value, loc, problems):
        if isinstance(value, bool) or not isinstance(value, int):  # strict: no "2", no true, no 2.0
            return self.wrong(loc, problems, "an integer", value)
        if self.minimum is not None and value < self.minimum:
            problems.append(Problem(loc, "invalid", f"must be at least {self.minimum} (got {value})"))
        return value


class Choice(Kind):
    def __init__(self, *options: str):
        self.options = options

    def describe(self):
        return "one of " + ", ".join(f"`{o}`" for o in self.options)

    def check(self, value, loc, problems):
        if isinstance(value, str) and value in self.options:
            return value
        quoted = [repr(o) for o in self.options]
        expected = " or ".join(quoted) if len(quoted) <= 2 else f"one of {', '.join(quoted)}"
        return self.wrong(loc, problems, expected, value)


class Parsed(Kind):
    """A value written in several forms and stored as one (a duration: "30m" -> 1800). `parse`
    raises ValueError with the message."""

    def __init__(self, parse: Callable[[Any], Any], label: str = "value"):
        self.parse, self.label = parse, label

    def describe(self):
        return self.label

    def check(self, value, loc, problems):
        try:
            return self.parse(value)
        except ValueError as exc:
            problems.append(Problem(loc, "invalid", str(exc)))
            return value


class Optional(Kind):
    """The inner kind, or null."""

    def __init__(self, inner: Kind):
        self.inner = inner

    def describe(self):
        return f"{self.inner.describe()}, or null"

    def check(self, value, loc, problems):
        return None if value is None else self.inner.check(value, loc, problems)


class Anything(Kind):
    def check(self, value, loc, problems):
        return value


class ListOf(Kind):
    def __init__(self, item: Kind):
        self.item = item

    def describe(self):
        return f"list of {self.item.describe()}s"

    def check(self, value, loc, problems):
        if not isinstance(value, list):
            return self.wrong(loc, problems, "a list", value)
        return [self.item.check(v, loc + (i,), problems) for i, v in enumerate(value)]


class MappingOf(Kind):
    """A mapping with string keys. `before` may rewrite the mapping first (env turns YAML's numbers
    and booleans into the strings an environment holds)."""

    def __init__(self, value: Kind, before: Callable[[dict], dict] | None = None):
        self.value, self.before = value, before

    def describe(self):
        return "mapping of strings to " + ("any values" if isinstance(self.value, Anything) else f"{self.value.describe()}s")

    def check(self, value, loc, problems):
        if not isinstance(value, dict):
            return self.wrong(loc, problems, "a mapping of keys to values", value)
        if self.before is not None:
            value = self.before(value)
        checked = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(Problem(loc + (key,), "invalid", f"keys must be strings (got {shown_value(key)})"))
            checked[key] = self.value.check(item, loc + (key,), problems)
        return checked


class Section(Kind):
    """A nested record (the spec's `slurm:` section)."""

    def __init__(self, record: type[Record]):
        self.record = record

    def describe(self):
        return "section (below)"

    def check(self, value, loc, problems):
        if isinstance(value, self.record):
            return value
        if not isinstance(value, dict):
            return self.wrong(loc, problems, "a mapping of keys to values", value)
        before = len(problems)
        values = self.record.check_mapping(value, loc, problems)
        return self.record(**values) if len(problems) == before else value


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    kind: Kind
    description: str
    checks: tuple[Callable[[Any], Any], ...] = ()  # each raises ValueError(message) on a bad value
    required: bool = False

    def check(self, value, loc, problems):
        before = len(problems)
        value = self.kind.check(value, loc, problems)
        if len(problems) == before and value is not None:
            for check in self.checks:
                try:
                    check(value)
                except ValueError as exc:
                    problems.append(Problem(loc, "invalid", str(exc)))
                    break
        return value


def field(kind: Kind, description: str, default: Any = REQUIRED, *, factory: Callable[[], Any] | None = None,
          checks: tuple = ()) -> Any:
    """A record's field: `name: int = field(Integer(minimum=1), "what it is", 1)`."""
    info = FieldInfo(kind, description, tuple(checks), required=default is REQUIRED and factory is None)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"spec": info})
    return dataclasses.field(default=default, metadata={"spec": info})


# (record class, names of fields whose values are already checked) while from_dict or replace makes a
# record: its __post_init__ then checks only the other fields, so a spec is checked once, not again
# at each step of loading (a record made any other way checks every field).
_ALREADY_CHECKED: contextvars.ContextVar = contextvars.ContextVar("already_checked", default=(None, frozenset()))


class Record:
    """Base of the spec's records; subclasses are `@dataclasses.dataclass(frozen=True, kw_only=True)`."""

    @classmethod
    def fields(cls) -> dict[str, FieldInfo]:
        cached = cls.__dict__.get("_fields")
        if cached is None:
            cached = {f.name: f.metadata["spec"] for f in dataclasses.fields(cls)}
            cls._fields = cached
        return cached

    def __post_init__(self):
        record, checked_names = _ALREADY_CHECKED.get()
        skipped = checked_names if record is type(self) else frozenset()
        problems: list[Problem] = []
        for name, info in self.fields().items():
            if name in skipped:
                continue
            value = getattr(self, name)
            checked = info.check(value, (name,), problems)
            if checked is not value:
                object.__setattr__(self, name, checked)  # normalised (a duration in seconds)
        if problems:
            raise InvalidRecord(problems)

    @classmethod
    def check_mapping(cls, data: dict, loc: tuple, problems: list[Problem]) -> dict:
        """The checked values of `data` by field name; what is wrong is appended to `problems`."""
        fields = cls.fields()
        values = {}
        for key, value in data.items():
            if key not in fields:
                problems.append(Problem(loc + (key,), "unknown_key", "unknown key"))
            else:
                values[key] = fields[key].check(value, loc + (key,), problems)
        for name, info in fields.items():
            if info.required and name not in data:
                problems.append(Problem(loc + (name,), "missing", "required key is missing"))
        return values

    @classmethod
    def from_dict(cls, data: Any):
        """Check `data` and make the record; raises InvalidRecord listing every problem."""
        problems: list[Problem] = []
        if not isinstance(data, dict):
            Kind.wrong((), problems, "a mapping of keys to values", data)
            raise InvalidRecord(problems)
        values = cls.check_mapping(data, (), problems)
        if problems:
            raise InvalidRecord(problems)
        return cls._made_from_checked(values, frozenset(values))

    @classmethod
    def _made_from_checked(cls, values: dict, checked_names: frozenset):
        token = _ALREADY_CHECKED.set((cls, checked_names))
        try:
            return cls(**values)
        finally:
            _ALREADY_CHECKED.reset(token)

    @classmethod
    def from_json(cls, text: str | bytes):
        return cls.from_dict(json.loads(text))

    def replace(self, **changes):
        """A copy with some fields changed; the changed ones are checked (the others were)."""
        values = {name: getattr(self, name) for name in self.fields()}
        values.update(changes)
        return self._made_from_checked(values, frozenset(self.fields()) - frozenset(changes))

    def to_dict(self) -> dict:
        """Plain values (nested records as mappings), copies: changing them leaves the record alone."""
        return {name: value.to_dict() if isinstance(value, Record) else _copy(value)
                for name, value in ((n, getattr(self, n)) for n in self.fields())}

    def to_json(self, indent: int | None = None, exclude: tuple = ()) -> str:
        """JSON as spec.json holds it; inf and nan as JSON's Infinity and NaN (Python's json reads them)."""
        data = {k: v for k, v in self.to_dict().items() if k not in exclude}
        return json.dumps(data, indent=indent, ensure_ascii=False, allow_nan=True)


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
