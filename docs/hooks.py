"""MkDocs hooks: the reference pages are generated from the code at build time, so they cannot drift.

A page asks for a generated part with an HTML comment on a line of its own:

    <!-- generated: spec -->                 every spec key: type, default, description (launcher/spec/model.py)
    <!-- generated: status -->               status.json's fields, with the comment beside each (launcher/states.py)
    <!-- generated: events -->               every event name written to events.jsonl, and where
    <!-- docstring: launcher.rundir -->      a module's (or a function's) docstring, as written

The figures the benchmark jobs write into jobs/ (jobs/*.png) are served from there, not copied: a
page links them as `jobs/NAME.png` relative to the site's root.

tests/test_docs.py uses the same functions to check that every spec key is listed and described.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- (generated|docstring): ([\w.]+) -->$", re.MULTILINE)


def _default(field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if dataclasses.is_dataclass(value):
        return "see below"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def spec_rows() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description) for every field of the spec model, sections included."""
    from launcher.spec.model import SPEC_KEYS

    rows = []
    for prefix, record in SPEC_KEYS.items():
        fields = {f.name: f for f in dataclasses.fields(record)}
        for name, info in record.fields().items():
            key = ".".join([*prefix, name])
            rows.append((key, info.kind.describe(), _default(fields[name]), info.description))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def spec_reference() -> str:
    from launcher.spec.model import SPEC_KEYS

    parts = []
    for prefix, record in SPEC_KEYS.items():
        title = "Top level" if not prefix else f"The `{'.'.join(prefix)}:` section"
        parts += [f"### {title}", "", "| key | type | default | description |", "|---|---|---|---|"]
        parts += [f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(description)} |"
                  for key, kind, default, description in spec_rows()
                  if tuple(key.split(".")[:-1]) == prefix]
        parts.append("")
    return "\n".join(parts)


def _comments(path: Path) -> dict[int, str]:
    with open(path, "rb") as handle:
        return {token.start[0]: token.string.lstrip("# ").strip() for token in tokenize.tokenize(handle.readline)
                if token.type == tokenize.COMMENT}


def status_reference() -> str:
    """StatusRecord's fields with their types and the comments written beside them."""
    import launcher.states as states

    path = Path(states.__file__)
    comments = _comments(path)
    tree = ast.parse(path.read_text())
    record = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "StatusRecord")
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for node in record.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            rows.append(f"| `{node.target.id}` | `{_cell(ast.unparse(node.annotation))}` | "
                        f"{_cell(comments.get(node.lineno, ''))} |")
    return "\n".join(rows)


def event_rows() -> list[tuple[str, str]]:
    """(event name, the files that write it) from every log_event("name", ...) call in launcher/."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                    ("log_event", "_log_event") and node.args and isinstance(node.args[0], ast.Constant)):
                found.setdefault(node.args[0].value, set()).add(str(path.relative_to(ROOT)))
    return [(name, ", ".join(sorted(files))) for name, files in sorted(found.items())]


def events_reference() -> str:
    rows = ["| event | written by |", "|---|---|"]
    rows += [f"| `{name}` | `{files}` |" for name, files in event_rows()]
    return "\n".join(rows)


def docstring(dotted: str) -> str:
    module, _, attr = dotted, "", ""
    while True:
        try:
            target = importlib.import_module(module)
            break
        except ImportError:
            module, _, tail = module.rpartition(".")
            attr = f"{tail}.{attr}" if attr else tail
    for part in filter(None, attr.split(".")):
        target = getattr(target, part)
    return inspect.getdoc(target) or ""


GENERATORS = {"spec": spec_reference, "status": status_reference, "events": events_reference}


def on_page_markdown(markdown, page, config, files):
    def replace(match):
        kind, name = match.groups()
        return GENERATORS[name]() if kind == "generated" else docstring(name)

    return MARKER.sub(replace, markdown)


def on_files(files, config):
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "jobs").glob("*.png")):
        files.append(File(f"jobs/{png.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
