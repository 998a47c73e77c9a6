"""`make mutate`: mutation testing (mutmut 3) of a few launcher/ modules, against the unit tests
that can reach them, so one module scores in minutes (issue 55: mutating all of launcher/ and
running the whole unit tier for mutmut's stats gave no score in 15 minutes).

    python tests/mutate.py [--base BASE] [--reach direct|imports] [MODULE ...] [-- PYTEST_ARGS]

MODULEs are dotted names (launcher.supervisor.governor); none: those changed since BASE. The tests
are the unit test files that import a module or name it (`direct`, the default), or also those whose
launcher/ imports, followed through each module's top-level imports, reach it (`imports`: a test of
the supervisor reaches the governor through it; more mutants killed, several times the time);
mutmut's stats pass then runs each mutant against the tests that called its function. mutmut runs in a copy of the checkout (build/mutate/), whose pyproject.toml names
only these modules to mutate (mutmut reads its settings from there alone).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGING = ROOT / "build" / "mutate"
# What the unit tier's mutation run leaves out (pyproject.toml's [tool.mutmut] pytest_add_cli_args).
NEVER = {"test_docs.py", "test_layout.py", "test_behaviour_audit.py"}


def module_file(module: str, root: Path = ROOT) -> Path:
    path = root / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = ROOT, top_level_only: bool = True) -> set[str]:
    """The launcher modules (and names in them, which may be modules) that `path` imports."""
    tree = ast.parse(path.read_text())
    here = module_name(path, root).split(".") if path.is_relative_to(root / "launcher") else []
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            found |= {source, *(f"{source}.{alias.name}" for alias in node.names)}
    return {name for name in found if name == "launcher" or name.startswith("launcher.")}


def reached(start: set[str], root: Path = ROOT) -> set[str]:
    """Every launcher module that importing `start` imports (their packages' __init__ too)."""
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if "." in name:
            todo.append(name.rsplit(".", 1)[0])
        path = module_file(name, root)
        if path.is_file():
            todo.extend(imported(path, root))
    return seen


def covering_tests(modules: list[str], reach: str = "direct", root: Path = ROOT) -> list[Path]:
    """The unit test files that import one of `modules` (direct) or reach one through imports."""
    chosen = []
    for test in sorted((root / "tests" / "unit").glob("test_*.py")):
        if test.name in NEVER:
            continue
        names = imported(test, root, top_level_only=False)  # a test imports inside its functions too
        text = test.read_text()
        if any(module in names or re.search(rf"\b{re.escape(module)}\b", text) for module in modules) or (
                reach == "imports" and set(modules) & reached(names, root)):
            chosen.append(test)
    return chosen


def changed_modules(base: str) -> list[str]:
    names = subprocess.run(["git", "diff", "--name-only", base, "--", "launcher/"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    return [module_name(ROOT / name) for name in names if name.endswith(".py") and (ROOT / name).exists()]


def stage(modules: list[str], tests: list[Path], pytest_args: list[str]) -> None:
    """build/mutate/: the checkout's files (tracked and new ones), with mutmut told to mutate
    `modules` only and to run `tests` only (with `pytest_args` added to its pytest arguments)."""
    shutil.rmtree(STAGING, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.splitlines()
    for name in files:
        source = ROOT / name
        if source.is_file() and not name.startswith(("build/", "mutants/")):
            (STAGING / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, STAGING / name)
    settings = STAGING / "pyproject.toml"
    text = settings.read_text()
    selection = re.compile(r"^pytest_add_cli_args_test_selection = .*$", re.M)
    if not selection.search(text):
        raise SystemExit("pyproject.toml has no [tool.mutmut] pytest_add_cli_args_test_selection line to replace")
    only = [str(module_file(m, Path("."))) for m in modules]
    text = selection.sub(lambda _: f"pytest_add_cli_args_test_selection = {json.dumps([str(t.relative_to(ROOT)) for t in tests])}\n"
                                   f"only_mutate = {json.dumps(only)}", text)
    arguments = re.compile(r"^pytest_add_cli_args = \[", re.M)
    if pytest_args:
        text = arguments.sub(lambda match: match.group(0) + "".join(f"{json.dumps(a)}, " for a in pytest_args), text)
    settings.write_text(text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*")
    parser.add_argument("--base", default="HEAD~1", help="with no MODULE: the modules changed since BASE")
    parser.add_argument("--reach", choices=["direct", "imports"], default="direct")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    # after `--`: more for pytest (--deselect=NODEID: a test this machine cannot pass)
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    modules = args.modules or changed_modules(args.base)
    if not modules:
        print(f"no launcher/ module changed since {args.base}")
        return 0
    missing = [m for m in modules if not module_file(m).is_file()]
    if missing:
        raise SystemExit(f"no such module: {', '.join(missing)} (a dotted name under launcher/)")
    tests = covering_tests(modules, args.reach)
    print(f"mutating: {' '.join(modules)}\nagainst {len(tests)} unit test files ({args.reach}): "
          f"{' '.join(t.name for t in tests)}", flush=True)
    if not tests:
        print("no unit test reaches them: nothing to score")
        return 1
    stage(modules, tests, pytest_args)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)],
                   cwd=STAGING, env=env)
    sys.path.insert(0, str(Path(__file__).parent))
    from mutation_score import main as score

    print(f"(mutmut's results are in {STAGING.relative_to(ROOT)}: `cd {STAGING.relative_to(ROOT)} && mutmut show NAME`)")
    return score([str(STAGING / "mutants"), *modules])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
