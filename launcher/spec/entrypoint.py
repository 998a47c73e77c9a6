"""The spec's entrypoint, checked before anything runs: the script or module exists (and parses),
or the file or module defines the function at its top level. Found and parsed (ast), never imported: the job's code must not run
in the launcher."""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import sys
from pathlib import Path

from ..errors import SpecError
from .model import MODULE, SCRIPT, JobSpec


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


def _check_parses(file: Path, where: str) -> None:
    """A script must at least parse: a syntax error found now costs no queue wait."""
    try:
        ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as exc:
        raise SpecError(f"{where}: entrypoint: {file}:{exc.lineno}: the script has a syntax error "
                        f"({exc.msg}).\n  fix: correct it; it would fail as soon as a rank runs it.") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{where}: entrypoint: cannot read {file}: {exc}.\n"
                        f"  fix: check the file and its permissions.") from None


def resolve_entrypoint(spec: JobSpec, spec_dir: Path, where: str) -> JobSpec:
    """Check that the entrypoint's file or module exists (and, for a function, defines it) without
    running any of the job's code. A file is made absolute (relative to the spec's folder). `where`
    is where the entrypoint was written (file:line or the --set flag), for messages."""
    kind = spec.entrypoint_kind
    target, _, function = spec.entrypoint.rpartition(":")
    if kind == MODULE:
        target, function = spec.entrypoint, None
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
        if kind == SCRIPT:
            _check_parses(resolved, where)
            return spec.replace(entrypoint=str(resolved))
        _check_defines(resolved, function, where, spec.entrypoint)
        return spec.replace(entrypoint=f"{resolved}:{function}")
    if target.startswith("launcher."):
        return spec  # jaxlaunch's own (the function job's entrypoint): installed with jaxlaunch itself
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
    as_file = f"{target.replace('.', '/')}.py" + (f":{function}" if function else "")
    if found is None and target not in sys.builtin_module_names:
        if in_spec_dir:
            raise SpecError(
                f"{where}: entrypoint: module {target!r} is in the spec's folder ({spec_dir}), but the ranks "
                f"import modules from the working directory ({os.getcwd()}).\n"
                f"  fix: run jaxlaunch from {spec_dir}, or name the file: '{as_file}'.")
        raise SpecError(f"{where}: entrypoint: module {target!r} not found (looked in {os.getcwd()} and "
                        f"the Python path).\n  fix: run jaxlaunch from the folder that holds the package, "
                        f"install it, or name its file: '{as_file}'.")
    if kind == MODULE:
        if found is not None and found.submodule_search_locations is not None and \
                _find_module(f"{target}.__main__", search) is None:
            raise SpecError(f"{where}: entrypoint: {target!r} is a package without a __main__ module, so it "
                            f"cannot run as a program (python -m {target} would fail too).\n"
                            f"  fix: name the module to run ('{target}.train'), or a function in it "
                            f"('{target}.train:main').")
        return spec
    origin = getattr(found, "origin", None)
    if origin and origin.endswith(".py") and Path(origin).is_file():
        _check_defines(Path(origin), function, where, spec.entrypoint)
    return spec
