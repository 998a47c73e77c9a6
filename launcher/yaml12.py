"""YAML 1.2 (core schema) for job specs: one pass over ruamel.yaml's event stream, with limits.

Why not a stock loader: a spec must load with YAML 1.2's core schema (`1e-3` is a float,
`on`/`yes` are strings, `1:30` is a string), keep the line of every key for error messages, and
turn anything hostile into a SpecError instead of a traceback or a hang. Building values
straight from the parser's events, without a node graph or recursion, makes all of that one
loop: nesting depth, alias expansion and size are counted as values are made, so a
"billion laughs" document or a 1000-deep flow list stops at the limit, not in a RecursionError
or after gigabytes.

What is accepted: the core schema's null, bool, int, float and str (plain scalars resolved by its
regular expressions), the tags !!str !!int !!float !!bool !!null !!seq !!map, anchors and aliases
(expanded as copies, so nothing is shared), and merge keys (`<<: *base`). Mapping keys must be
strings. One document only.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import SpecError

MAX_BYTES = 1 << 20  # a spec is configuration; data belongs in files the job reads
MAX_DEPTH = 64       # nesting levels of mappings and lists
MAX_VALUES = 100_000  # values after alias expansion (mappings, lists and scalars all count)

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT10 = re.compile(r"[-+]?[0-9]+")
_INT8 = re.compile(r"0o[0-7]+")
_INT16 = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")

# Characters YAML does not allow in a stream (the complement of c-printable, which is \x09 \x0a
# \x0d \x20-\x7e \x85 \xa0-\ud7ff \ue000-\ufffd \U00010000-\U0010ffff); refused before parsing.
# Written as the complement because the negated class takes 7 ms to compile, at every start.
_NOT_PRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")

TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {"str", "int", "float", "bool", "null"}


class YAMLSyntaxError(SpecError):
    """The text is not YAML at all (as opposed to YAML that breaks a rule or a limit)."""


@dataclass
class Loaded:
    """The document's value, and the 1-based line of every key path (list items by index)."""
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)


class _Fail(Exception):
    """An error at a line and key path; load() turns it into a SpecError with the location."""

    def __init__(self, line: int | None, path: tuple, message: str, fix: str):
        super().__init__(message)
        self.line, self.path, self.message, self.fix = line, path, message, fix


def dotted(path: tuple) -> str:
    """`a.b.0` for messages; very deep paths are shortened to their first and last parts."""
    parts = [str(p)[:60] for p in path]
    if len(parts) > 8:
        parts = parts[:4] + [f"...({len(parts) - 6} more)..."] + parts[-2:]
    return ".".join(parts)


def _core_scalar(text: str):
    """A plain scalar under the core schema."""
    if _NULL.fullmatch(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT10.fullmatch(text):
        return int(text, 10)
    if _INT8.fullmatch(text):
        return int(text[2:], 8)
    if _INT16.fullmatch(text):
        return int(text[2:], 16)
    if _FLOAT.fullmatch(text) or _INF.fullmatch(text) or _NAN.fullmatch(text):
        return float(text.replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf")
                     .replace(".nan", "nan").replace(".NaN", "nan").replace(".NAN", "nan"))
    return text


def _tagged_scalar(tag: str, text: str, line: int, path: tuple):
    """A scalar with an explicit core tag (!!int 3); anything that does not fit is an error."""
    kind = tag[len(TAG):]
    if kind == "str":
        return text
    value = _core_scalar(text)
    if isinstance(value, int) and not isinstance(value, bool) and kind == "float":
        value = float(value)
    wanted = {"int": int, "float": float, "bool": bool, "null": type(None)}[kind]
    if type(value) is not wanted:
        readable = {"int": "an integer", "float": "a number", "bool": "true or false", "null": "null"}[kind]
        raise _Fail(line, path, f"!!{kind} {text!r} is not {readable}",
                    f"write {readable}, or drop the !!{kind} tag")
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")


def _join_surrogate_pairs(text: str) -> str:
    """Join escaped surrogate pairs: in JSON (which YAML 1.2 reads) "\\ud83d\\ude00" is one
    character, but the parser gives two lone surrogates. A surrogate without its pair stays, and
    validation refuses it."""
    if not _SURROGATE.search(text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        return text


def _scalar(event, line: int, path: tuple):
    tag, text = event.tag, _join_surrogate_pairs(event.value)
    if tag is None:
        if event.implicit[0]:  # plain: resolved by the core schema
            try:
                return _core_scalar(text)
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                raise _Fail(line, path, f"{text[:40]!r}... is not a usable number ({exc})",
                            "write a smaller number, or quote it to keep it as text") from None
        return text  # quoted: always a string
    if tag == "!":
        return text  # the non-specific tag: a string
    if tag.startswith(TAG) and tag[len(TAG):] in _SCALAR_TAGS:
        try:
            return _tagged_scalar(tag, text, line, path)
        except ValueError as exc:
            raise _Fail(line, path, f"{text[:40]!r} is not a usable number ({exc})",
                        "write a smaller number") from None
    raise _Fail(line, path, f"the tag {_short_tag(tag)} is not supported",
                "remove the tag; a spec takes plain strings, numbers, booleans, lists and mappings "
                "(tags allowed: !!str !!int !!float !!bool !!null !!seq !!map)")


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(TAG):] if tag.startswith(TAG) else tag


def _count(value) -> tuple[int, int]:
    """(values, nesting height) of a constructed value; for merge copies."""
    if isinstance(value, dict):
        counts = [_count(v) for v in value.values()]
    elif isinstance(value, list):
        counts = [_count(v) for v in value]
    else:
        return 1, 0
    return 1 + sum(c for c, _ in counts), 1 + max((h for _, h in counts), default=0)


class _Frame:
    """A mapping or list being built."""

    def __init__(self, value, path, line, anchor, counted_before):
        self.value, self.path, self.line, self.anchor = value, path, line, anchor
        self.counted_before = counted_before
        self.height = 1
        self.key = None          # mapping: the key whose value comes next (None: a key comes next)
        self.key_line = None
        self.expect_key = isinstance(value, dict)
        self.key_lines = {}      # mapping: key -> line, for duplicate keys
        self.merges = []         # mapping: (line, mapping) from `<<` keys, applied at the end


class _Builder:
    def __init__(self):
        from ruamel.yaml import events
        self.ev = events
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int, int]] = {}  # name -> (value, values, height)
        self.open_anchors: set[str] = set()
        self.values = 0
        self.lines: dict[tuple, int] = {(): 1}
        self.root = None
        self.documents = 0

    # -- counting -------------------------------------------------------------------------
    def _add(self, n: int, line: int, path: tuple, why: str = "") -> None:
        self.values += n
        if self.values > MAX_VALUES:
            raise _Fail(line, path, f"the document expands to more than {MAX_VALUES} values{why}",
                        "write the values out, or use fewer aliases; a spec is configuration, not data")

    def _depth_check(self, extra: int, line: int, path: tuple) -> None:
        if len(self.stack) + extra > MAX_DEPTH:
            raise _Fail(line, path, f"nested more than {MAX_DEPTH} levels deep",
                        "flatten the structure; a spec does not need this depth")

    # -- where the next value goes ----------------------------------------------------------
    def _child_path(self) -> tuple:
        if not self.stack:
            return ()
        top = self.stack[-1]
        return top.path + ((top.key,) if isinstance(top.value, dict) else (len(top.value),))

    def _attach(self, value, line: int, height: int) -> None:
        if not self.stack:
            self.root = value
            return
        top = self.stack[-1]
        top.height = max(top.height, height + 1)
        if isinstance(top.value, list):
            self.lines.setdefault(top.path + (len(top.value),), line)
            top.value.append(value)
            return
        key = top.key
        if key is _MERGE:
            mappings = value if isinstance(value, list) else [value]
            if not mappings or not all(isinstance(m, dict) for m in mappings):
                raise _Fail(top.key_line, top.path + ("<<",), "a merge key (<<) needs a mapping or a list of "
                            "mappings", "write `<<: *anchor` where the anchor is a mapping")
            top.merges += [(top.key_line, m) for m in mappings]
        else:
            top.value[key] = value
        top.key, top.expect_key = None, True

    def _take_key(self, event, line: int) -> None:
        top = self.stack[-1]
        path = top.path
        if not isinstance(event, self.ev.ScalarEvent):
            what = "an alias" if isinstance(event, self.ev.AliasEvent) else "a list or mapping"
            raise _Fail(line, path, f"a key is {what}; keys must be plain strings",
                        "use a plain name as the key")
        key = _scalar(event, line, path)
        if key == "<<" and event.tag is None and event.implicit[0]:
            top.key, top.key_line, top.expect_key = _MERGE, line, False
            return
        if not isinstance(key, str):
            kind = "empty (null)" if key is None else f"{type(key).__name__} {key!r}"
            raise _Fail(line, path + (str(key),), f"the key is {kind}; keys must be strings",
                        f"quote it: '{event.value}':")
        if key in top.key_lines:
            raise _Fail(line, path + (key,), f"duplicate key (first set on line {top.key_lines[key]})",
                        "keep only one of them")
        top.key_lines[key] = line
        self.lines[path + (key,)] = line
        top.key, top.key_line, top.expect_key = key, line, False

    # -- events -----------------------------------------------------------------------------
    def feed(self, event) -> None:
        ev = self.ev
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, ev.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise _Fail(line, (), "the file holds more than one YAML document (a second `---`)",
                            "keep one document per spec file")
            return
        if isinstance(event, (ev.StreamStartEvent, ev.StreamEndEvent, ev.DocumentEndEvent)):
            return
        if isinstance(event, (ev.MappingEndEvent, ev.SequenceEndEvent)):
            self._close(line)
            return
        if self.stack and self.stack[-1].expect_key:
            self._take_key(event, line)
            return
        path = self._child_path()
        if isinstance(event, ev.AliasEvent):
            self._alias(event, line, path)
        elif isinstance(event, ev.ScalarEvent):
            self._add(1, line, path)
            value = _scalar(event, line, path)
            if event.anchor is not None:
                self.anchors[event.anchor] = (value, 1, 0)
            self._attach(value, line, 0)
        elif isinstance(event, (ev.MappingStartEvent, ev.SequenceStartEvent)):
            is_map = isinstance(event, ev.MappingStartEvent)
            allowed = (None, "!", TAG + ("map" if is_map else "seq"))
            if event.tag not in allowed:
                raise _Fail(line, path, f"the tag {_short_tag(event.tag)} is not supported on a "
                            f"{'mapping' if is_map else 'list'}", "remove the tag")
            self._depth_check(1, line, path)
            self._add(1, line, path)
            if event.anchor is not None:
                self.open_anchors.add(event.anchor)
            self.lines.setdefault(path, line)
            self.stack.append(_Frame({} if is_map else [], path, line, event.anchor, self.values - 1))

    def _alias(self, event, line: int, path: tuple) -> None:
        name = event.anchor
        if name in self.open_anchors:
            raise _Fail(line, path, f"the alias *{name} refers to the value that contains it (a recursive "
                        "alias)", f"point *{name} at a value defined before and outside it")
        if name not in self.anchors:
            raise _Fail(line, path, f"the alias *{name} has no anchor &{name} before it",
                        f"define &{name} earlier in the file, or fix the name")
        value, values, height = self.anchors[name]
        self._add(values, line, path, f" once its aliases are expanded (*{name} on line {line})")
        self._depth_check(height, line, path)
        self._attach(copy.deepcopy(value), line, height)

    def _close(self, line: int) -> None:
        frame = self.stack.pop()
        # Merge keys: explicit keys win, then earlier merged mappings over later ones.
        for merge_line, mapping in frame.merges:
            for key, value in mapping.items():
                if key not in frame.value:
                    values, height = _count(value)
                    self._add(values, merge_line, frame.path + (key,), " once merge keys are expanded")
                    self._depth_check(1 + height, merge_line, frame.path + (key,))
                    frame.value[key] = value  # already a copy: aliases are copied when used
                    frame.height = max(frame.height, height + 1)
                    self.lines[frame.path + (key,)] = merge_line
        values = self.values - frame.counted_before
        if frame.anchor is not None:
            self.open_anchors.discard(frame.anchor)
            self.anchors[frame.anchor] = (frame.value, values, frame.height)
        self._attach(frame.value, frame.line, frame.height)


_MERGE = object()


def load(text: str, where: Callable[[int | None, tuple], str]) -> Loaded:
    """Parse one YAML 1.2 document. `where(line, key_path)` names a location for error messages
    (e.g. 'job.yaml:3: nodes' or '--set nodes=x'). Every failure is a SpecError."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise SpecError(f"{where(None, ())}: {size} bytes; the limit is {MAX_BYTES} bytes.\n"
                        f"  fix: keep data out of the spec: put it in a file and pass its path in params.")
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        column = bad.start() - (text.rfind("\n", 0, bad.start()) + 1) + 1
        code = ord(bad.group())
        if 0xD800 <= code <= 0xDFFF:
            raise SpecError(f"{where(line, ())}: contains a lone surrogate (U+{code:04X}, column {column}), which "
                            f"is not valid Unicode and cannot be written as UTF-8.\n"
                            f"  fix: remove it; from --set, check the shell's quoting and the terminal's encoding.")
        escape = f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
        raise SpecError(f"{where(line, ())}: contains the control character U+{code:04X} (column {column}), "
                        f"which YAML does not allow.\n"
                        f"  fix: remove it, or write it as an escape inside double quotes (\"{escape}\").")
    builder = _Builder()
    try:
        for event in YAML(typ="safe", pure=True).parse(text):
            builder.feed(event)
    except _Fail as fail:
        located = where(fail.line, fail.path)
        raise SpecError(f"{located}: {fail.message}.\n  fix: {fail.fix}.") from None
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
        raise YAMLSyntaxError(f"{where(line, ())}: not valid YAML: {problem}.\n"
                        f"  fix: check indentation and quoting on that line.") from None
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError, IndexError) as exc:
        # The parser itself failed in a way it does not report as a YAML error: still the spec's fault.
        raise SpecError(f"{where(None, ())}: not valid YAML ({type(exc).__name__}: {exc}).\n"
                        f"  fix: check the file's syntax; keep it simple and shallow.") from None
    return Loaded(builder.root, builder.lines)
