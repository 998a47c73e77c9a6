"""MkDocs hooks: the reference pages are generated from the code at build time, so they cannot drift.

A page asks for a generated part with an HTML comment on a line of its own:

    <!-- generated: spec -->                 every spec key: type, default, description (launcher/spec/model.py)
    <!-- generated: status -->               status.json's fields, with the comment beside each (launcher/states.py)
    <!-- generated: events -->               every event name written to events.jsonl, and where
    <!-- generated: entrypoints -->          the four kinds of entrypoint (launcher/spec/model.py)
    <!-- docstring: launcher.rundir -->      a module's (or a function's) docstring, as written

The figures of the benchmark jobs (jobs/benchmarks/*.png, beside the jobs that make them) are served
from there, not copied: a page links them as `jobs/benchmarks/NAME.png` relative to the site's root.
Figures only the docs show live in docs/figures/.

tests/unit/test_docs.py uses the same functions to check that every spec key is listed and described.
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


def _dunder_code(text: str) -> str:
    """`__main__` in backticks where a description writes it bare: Markdown reads `__x__` as bold x."""
    return re.sub(r"(?<![`\w])__(\w+?)__(?![`\w])", r"`__\1__`", text)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code_cell(text: str) -> str:
    """A table cell in backticks. Python-Markdown's tables never split a cell at a `|` inside a code
    span, and keep a backslash there as written: `str \\| None` would show its backslash."""
    return f"`{text.replace(chr(10), ' ')}`"


def spec_reference() -> str:
    from launcher.spec.model import SPEC_KEYS

    parts = []
    for prefix, record in SPEC_KEYS.items():
        title = "Top level" if not prefix else f"The `{'.'.join(prefix)}:` section"
        parts += [f"### {title}", "", "| key | type | default | description |", "|---|---|---|---|"]
        parts += [f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(_dunder_code(description))} |"
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
            rows.append(f"| `{node.target.id}` | {_code_cell(ast.unparse(node.annotation))} | "
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
    return docstring_markdown(inspect.getdoc(target) or "")


PATH_LIKE = re.compile(r"[\w.*{}-]+(/[\w.*{}-]*)*")


def _entry(line: str) -> tuple[str, str] | None:
    """(name, description) of a line of a docstring's layout: a path (`logs/rank-N.log  everything
    rank N printed`) or a JSON object (`{"__tuple__": [...]}  a tuple`) and what it is; else None."""
    line = line.strip()
    if line.startswith("{"):
        depth = 0
        for end, char in enumerate(line):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if depth == 0:
                break
        name, description = line[:end + 1], line[end + 1:]
    else:
        name, _, description = line.partition(" ")
        if not PATH_LIKE.fullmatch(name) or not ("." in name or name.endswith("/")):
            return None
    return (name, description.strip()) if description.strip() else None


def _layout_table(block: list[str]) -> list[str] | None:
    """A docstring's layout (each line a path or a JSON object, then what it is, a longer
    description going on in lines indented further) as a table, which wraps descriptions to the page
    instead of running off its right edge; None for any other indented block (a tree, code)."""
    base = min(len(line) - len(line.lstrip()) for line in block)
    rows = []
    for line in block:
        if len(line) - len(line.lstrip()) > base and rows:
            rows[-1][1] += " " + line.strip()
            continue
        entry = _entry(line)
        if entry is None:
            return None
        rows.append(list(entry))
    if len(rows) < 2:
        return None
    head = "in the file" if rows[0][0].startswith("{") else "path"
    return [f"| {head} | what it holds |", "|---|---|",
            *(f"| {_code_cell(name)} | {_cell(text)} |" for name, text in rows)]


def docstring_markdown(text: str) -> str:
    """A docstring as Markdown. An indented block is a code block, except a file layout, which
    becomes a table; a block right under a line ending in a colon (`Layout:` then `    spec.json
    ...`), which Markdown would run into that line's paragraph, gets the blank line it needs."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].startswith("    "):
            out.append(lines[i])
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].startswith("    "):
            end += 1
        block = lines[i:end]
        if out and out[-1].strip():
            if not out[-1].endswith(":"):  # a paragraph's own indented line, not a block
                out += block
                i = end
                continue
            out.append("")
        table = _layout_table(block)
        out += table + [""] if table else block
        i = end
    return "\n".join(out)


# An example of each kind of entrypoint the model knows (launcher/spec/model.py's ENTRYPOINT_KINDS).
# A kind added there without an example here fails the build, as does an example the model reads
# as another kind.
ENTRYPOINT_EXAMPLES = {"script": ["train.py", "tools/solve.py"], "module": ["pkg.train", "pytest"],
                       "file.py:function": ["train.py:main"], "module:function": ["pkg.train:main"]}


def entrypoints_reference() -> str:
    """The four kinds of entrypoint: an example of each, and what a rank does with it."""
    from launcher.spec.model import ENTRYPOINT_KINDS, entrypoint_kind

    rows = ["| `entrypoint:` | kind | what every rank does |", "|---|---|---|"]
    for kind, description in ENTRYPOINT_KINDS.items():
        examples = ENTRYPOINT_EXAMPLES[kind]
        wrong = [example for example in examples if entrypoint_kind(example) != kind]
        assert not wrong, f"docs/hooks.py: {wrong} is not a {kind} entrypoint for the spec model"
        rows.append(f"| {', '.join(f'`{example}`' for example in examples)} | {_cell(kind)} | "
                    f"{_cell(_dunder_code(description))} |")
    return "\n".join(rows)


GENERATORS = {"spec": spec_reference, "status": status_reference, "events": events_reference,
              "entrypoints": entrypoints_reference}


def on_page_markdown(markdown, page, config, files):
    def replace(match):
        kind, name = match.groups()
        return GENERATORS[name]() if kind == "generated" else docstring(name)

    return MARKER.sub(replace, markdown)


# mkdocs-click writes an option's default as `str(option.default)`. Under Click 8.3+ an option declared
# without a default holds Click's UNSET sentinel, shown as `Sentinel.UNSET`; None is shown as "None".
# Either means the option has no default: the cell is left empty, as `jaxlaunch CMD --help` shows it.
NO_DEFAULT_CELL = re.compile(r"<td>(?:<code>Sentinel\.UNSET</code>|None)</td>")


def on_page_content(html, page, config, files):
    if "::: mkdocs-click" in page.markdown:
        html = NO_DEFAULT_CELL.sub("<td></td>", html)
    return html


def on_files(files, config):
    from mkdocs.structure.files import File

    for png in sorted((ROOT / "jobs" / "benchmarks").glob("*.png")):
        files.append(File(f"jobs/benchmarks/{png.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
