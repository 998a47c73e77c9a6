"""The run directory has one owner (launcher/rundir/): every name in it is spelled once, in
launcher/rundir/names.py, and no launcher module outside launcher/rundir/ spells one of its file
names as a string literal (it asks RunDirectory for the path, or imports the name)."""

import ast
import re
from pathlib import Path

import launcher
from launcher.rundir import RunDirectory, names

PACKAGE = Path(launcher.__file__).parent
OWNER = PACKAGE / "rundir"

# Spellings in files another change is editing now, which move to RunDirectory / rundir.names once it
# lands (path: {literal: how many}). Only ever shrinks: a new spelling anywhere fails.
PENDING: dict[str, dict[str, int]] = {}


def literal_text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with '*' for each {...} (f"rank-{n}.log": 'rank-*.log')."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "*" for part in node.values)
    return None


def spelled_name(text: str) -> str | None:
    """The run-directory file name `text` spells as a path: the whole literal ('failure.json',
    'rank-*.log'), or the end of a path in it ('logs/launcher.log', '{run}/failure.json)'); None
    where it is only mentioned ('the run's status.json')."""
    for name in names.FILE_NAMES:
        if text == name or re.search(rf"/{re.escape(name)}(?![\w.-])", text):
            return name
    return None


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' nodes (prose, where a file name is the reader's guide)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spellings(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string literal in `source` that spells a run-directory file name."""
    found = set()
    tree = ast.parse(source)
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    skipped = parts | docstrings(tree)  # an f-string is read whole
    for node in ast.walk(tree):
        text = literal_text(node) if id(node) not in skipped else None
        if text is not None and spelled_name(text):
            found.add((node.lineno, text))
    return sorted(found)


def spellings_outside_the_owner() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if OWNER in path.parents:
            continue
        name = path.relative_to(PACKAGE.parent).as_posix()
        allowed = dict(PENDING.get(name, {}))
        for line, text in spellings(path.read_text()):
            if allowed.get(text, 0) > 0:
                allowed[text] -= 1
            else:
                found.append(f"{name}:{line}: {text!r}")
    return found


def test_the_checker_finds_a_spelled_name():
    source = '''
"""A docstring naming status.json is prose."""
a = run / "status.json"
b = f"{run}/logs/launcher.log"
c = logs.glob("rank-*.error.json")
d = logs / f"rank-{rank}.state.json"
e = "the run's status.json is missing"
f = "status.json.bak", "manifest.json", "results.json"
g = f"  details: {run}/failure.json (see {run}/logs/rank-{rank}.log)"


def h():
    """Reads RUN_DIR/events.jsonl."""
'''
    assert spellings(source) == [(3, "status.json"), (4, "*/logs/launcher.log"), (5, "rank-*.error.json"),
                                 (6, "rank-*.state.json"), (9, "  details: */failure.json (see */logs/rank-*.log)")]


def test_every_path_of_run_directory_is_one_of_the_names():
    run = RunDirectory("/run")
    paths = [getattr(run, attr) for attr, value in vars(RunDirectory).items() if isinstance(value, property)]
    paths += [run.rank_log(3), run.rank_error(3), run.rank_error_record(3), run.rank_state(3)]
    for path in paths:
        assert path.name in names.FOLDER_NAMES or spelled_name(path.name.replace("3", "*")), path


def test_no_module_outside_launcher_rundir_spells_a_run_directory_file_name():
    found = spellings_outside_the_owner()
    assert not found, ("a run-directory file name spelled outside launcher/rundir/ (use RunDirectory's path, "
                       "or the name from launcher/rundir/names.py): " + ", ".join(found))
