"""The package's shape: imports flow one way, between modules and between packages (no cycles,
counting the imports inside functions too, since those only hide a cycle); nothing outside a
backend's package reaches into it; no module takes another's private (underscore) names; every
package says in its docstring what lives in it; and JAX's internals stay in the two modules that
need them."""

import ast
import re
from pathlib import Path

import launcher

PACKAGE = Path(launcher.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_from(package: str, node: ast.ImportFrom) -> str:
    """The module a `from ... import` statement in `package` reads from (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The launcher modules `name` imports anywhere in its file (module level or in a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            prefix = imported_from(package, node)
            # `from pkg import submodule` imports the submodule; `from module import name` the module
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_launcher_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def packages() -> set[str]:
    return {module_name(init) for init in PACKAGE.rglob("__init__.py")}


def package_of(module: str, known_packages: set[str]) -> str:
    """The unit a module counts as for the package-level rule: a backend's own package
    (launcher.backends.slurm), else its first-level package (launcher.rank, launcher.supervisor),
    else the top-level module itself (launcher.cli)."""
    parts = module.split(".")
    for depth in (3, 2):
        head = ".".join(parts[:depth])
        if len(parts) >= depth and head in known_packages and (depth == 2 or parts[1] == "backends"):
            return head
    return module


def package_graph(graph: dict[str, set[str]], known_packages: set[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for module, targets in graph.items():
        unit = package_of(module, known_packages)
        found.setdefault(unit, set()).update(package_of(t, known_packages) for t in targets)
        found[unit].discard(unit)
    for targets in list(found.values()):
        for target in targets:
            found.setdefault(target, set())
    return found


def backend_packages(known_packages: set[str]) -> list[str]:
    return sorted(p for p in known_packages if p.startswith("launcher.backends.") and p.count(".") == 2)


def reaches_into_a_backend(graph: dict[str, set[str]], known_packages: set[str]) -> list[str]:
    """`importer -> module` for every import of a module inside a backend's package from outside
    it: outside code uses only the package's own exports (its __init__)."""
    found = []
    for backend in backend_packages(known_packages):
        for module, targets in sorted(graph.items()):
            if module == backend or module.startswith(backend + "."):
                continue
            found += [f"{module} -> {t}" for t in sorted(targets) if t.startswith(backend + ".")]
    return found


def test_the_package_checker_finds_a_cycle_that_modules_hide():
    """a.x imports b.y and b.z imports a.w: no module cycle, but the packages a and b need each other."""
    graph = {"launcher.a.x": {"launcher.b.y"}, "launcher.a.w": set(), "launcher.b.y": set(),
             "launcher.b.z": {"launcher.a.w"}}
    known = {"launcher", "launcher.a", "launcher.b"}
    assert find_cycle(graph) is None
    assert find_cycle(package_graph(graph, known)) == ["launcher.a", "launcher.b", "launcher.a"]


def test_launcher_has_no_package_cycles():
    cycle = find_cycle(package_graph(import_graph(), packages()))
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_backend_checker_finds_an_outside_import_of_an_internal():
    graph = {"launcher.cli": {"launcher.backends.slurm", "launcher.backends.slurm.scheduler"},
             "launcher.backends.slurm": {"launcher.backends.slurm.scheduler"},
             "launcher.backends.slurm.scheduler": set(), "launcher.backends.base": set()}
    known = {"launcher", "launcher.backends", "launcher.backends.slurm"}
    assert reaches_into_a_backend(graph, known) == ["launcher.cli -> launcher.backends.slurm.scheduler"]


def test_nothing_outside_a_backend_reaches_into_it():
    """Each backend is one package (launcher/backends/slurm/, launcher/backends/local/): code
    outside it imports only what its __init__ exports, so a backend can change inside freely."""
    assert backend_packages(packages()) == ["launcher.backends.local", "launcher.backends.slurm"]
    found = reaches_into_a_backend(import_graph(), packages())
    assert not found, "imports of a backend's internals from outside it:\n  " + "\n  ".join(found)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_definitions(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions, classes, assigned and imported names,
    arguments, and the attributes it sets on self or cls."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.add(node.attr)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
    return {name for name in found if is_private(name)}


def private_names_taken(sources: dict[str, str]) -> list[str]:
    """`module:line what` for every private (underscore) name a launcher module takes from another:
    `from m import _x` (relative imports too), `m._x` where `m` is an imported launcher module, and
    `obj._x` where `_x` is defined by another module and not by this one (another module's class
    keeps it to itself). Dunders are public. `sources` maps module names to their text; a module
    with submodules among them is a package (its __init__), which relative imports resolve from."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    defined = {name: private_definitions(tree) for name, tree in trees.items()}
    found = []
    for name, tree in sorted(trees.items()):
        package = name if any(other.startswith(name + ".") for other in trees) else name.rpartition(".")[0]
        modules_here = {}  # local name -> the launcher module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    head = alias.name if alias.asname else alias.name.split(".")[0]
                    modules_here[alias.asname or head] = head
            elif isinstance(node, ast.ImportFrom):
                prefix = imported_from(package, node)
                for alias in node.names:
                    if f"{prefix}.{alias.name}" in trees:
                        modules_here[alias.asname or alias.name] = f"{prefix}.{alias.name}"
                    elif prefix in trees and prefix != name and is_private(alias.name):
                        found.append(f"{name}:{node.lineno} imports {prefix}.{alias.name}")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls") and not chain:
                continue
            module = None
            if isinstance(value, ast.Name) and value.id in modules_here:
                module = ".".join([modules_here[value.id], *chain])
            if module in trees:
                if module != name:
                    found.append(f"{name}:{node.lineno} uses {module}.{node.attr}")
            elif node.attr not in defined[name]:
                owners = sorted(other for other in trees if node.attr in defined[other])
                if owners:
                    found.append(f"{name}:{node.lineno} uses {ast.unparse(node)}, private to {' or '.join(owners)}")
    return sorted(found)


def test_the_private_name_checker_finds_names_taken_from_another_module():
    sources = {
        "launcher": "import launcher.b\n\nX = launcher.b._y\n",
        "launcher.a": ("from .b import _x, y, __version__\nfrom . import b\nimport launcher.b as bee\nimport os\n\n"
                       "def f(thing):\n    os._exit(b._x + bee._y() + thing.b._held + thing._own)\n"),
        "launcher.b": ("import os\n\n_x = y = 1\n__version__ = '1'\n\ndef _y():\n    return os._exit\n\n"
                       "class B:\n    def __init__(self):\n        self._held = None\n\n"
                       "    def same(self, other):\n        return other._held\n"),
        "launcher.pkg": "from .m import _w\n",
        "launcher.pkg.m": "from ..b import _x as x\n\n_w = x\n",
        "launcher.c": "from launcher.pkg import m\n\n\ndef f():\n    return m._w\n",
        "launcher.d": "_own = 1\n\n\ndef f(thing):\n    return thing._own\n",
    }
    assert private_names_taken(sources) == [
        "launcher.a:1 imports launcher.b._x",
        "launcher.a:7 uses launcher.b._x",
        "launcher.a:7 uses launcher.b._y",
        "launcher.a:7 uses thing._own, private to launcher.d",
        "launcher.a:7 uses thing.b._held, private to launcher.b",
        "launcher.c:5 uses launcher.pkg.m._w",
        "launcher.pkg.m:1 imports launcher.b._x",
        "launcher.pkg:1 imports launcher.pkg.m._w",
        "launcher:3 uses launcher.b._y",
    ]
    assert private_names_taken({"launcher": "", "launcher.b": sources["launcher.b"]}) == []


def test_no_module_takes_another_modules_private_names():
    """A name with an underscore belongs to its module, which may change it freely; what another
    module needs gets a public name where it is defined (the collectives' shared helpers have theirs
    inside launcher/rank/collectives/)."""
    found = private_names_taken({name: path.read_text() for name, path in modules().items()})
    assert not found, "private names taken from another module (give them public names):\n  " + "\n  ".join(found)


def test_every_package_says_what_lives_in_it():
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 80, f"{init.relative_to(PACKAGE.parent)} needs a docstring saying what lives there"


def test_every_package_ships_in_a_non_editable_install():
    """pyproject.toml lists the packages by name: one left out is missing from the wheel (and from a
    container image, which installs it non-editable) while editable installs hide the mistake."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(init) for init in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"add them to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"


# JAX's internals (`jax._src`) move between releases without notice. Each use sits behind an import with a
# public fallback, in the one module that owns it: the staged path of the collectives, and the transport,
# whose primitive's lowering needs JAX's ShardingContext and hlo dialect (no public name in jax 0.10).
# mpi4jax's own internals (`mpi4jax._src`) are another matter, and not matched.
JAX_INTERNALS = re.compile(r"(?<![\w.])jax\._src\b|\bfrom\s+jax\s+import\s+[^#\n]*\b_src\b")
MAY_USE_JAX_INTERNALS = {"launcher/rank/collectives/staged.py", "launcher/rank/collectives/transport.py"}


def mentions_of_jax_internals() -> list[str]:
    """`file:line` of every line under launcher/ that names JAX's internals, outside the modules allowed to."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        if name not in MAY_USE_JAX_INTERNALS:
            found += [f"{name}:{number}" for number, line in enumerate(path.read_text().splitlines(), 1)
                      if JAX_INTERNALS.search(line)]
    return found


def test_the_checker_finds_jax_internals():
    for line in ("from jax._src.lib import _jax", "import jax._src.array", "x = jax._src.core", "from jax import _src"):
        assert JAX_INTERNALS.search(line), line
    assert not JAX_INTERNALS.search("from mpi4jax._src import xla_bridge")


def test_only_the_staged_path_and_the_transport_touch_jax_internals():
    found = mentions_of_jax_internals()
    assert not found, ("JAX internals (jax._src) outside launcher/rank/collectives/staged.py and transport.py: "
                       + ", ".join(found))


# --- states are JobState members, not their spelling -------------------------------------------------
# A state written as a bare string ("COMPLETED") outside launcher/states.py is a typo waiting to happen
# and a state no reader can find. Allowed: a docstring; the keys of a dict literal (a table from another
# system's words, as Slurm's in backends/slurm/scheduler.py); a line that says `# Slurm's word` or
# `# not a state` (the drill's verdict, FAILED).

ALLOWED_WORDS = ("# Slurm's word", "# not a state")


def bare_states(sources: dict[str, str]) -> list[str]:
    """'module:line "STATE"' for each string constant spelling a JobState outside launcher.states."""
    from launcher.states import JobState

    names = {state.value for state in JobState}
    found = []
    for module, source in sorted(sources.items()):
        if module == "launcher.states":
            continue
        tree = ast.parse(source)
        lines = source.splitlines()
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body \
                    and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
                skip.add(id(node.body[0].value))  # a docstring
            if isinstance(node, ast.Dict):
                skip.update(id(key) for key in node.keys if key is not None)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                    and id(node) not in skip and not any(word in lines[node.lineno - 1] for word in ALLOWED_WORDS)):
                found.append(f"{module}:{node.lineno} {node.value!r}")
    return found


def test_the_state_checker_finds_a_bare_state():
    planted = {
        "launcher.a": 'def f(status):\n    """Ends COMPLETED."""\n    return status.state == "COMPLETED"\n',
        "launcher.b": 'TABLE = {"RUNNING": 1}\nWORD = "RUNNING"  # Slurm\'s word\nTEXT = "the job ended FAILED"\n',
        "launcher.c": 'from launcher.states import JobState\nx = {"state": "FAILED"}\n',
        "launcher.states": 'X = "FAILED"\n',
    }
    assert bare_states(planted) == ["launcher.a:3 'COMPLETED'", "launcher.c:2 'FAILED'"]


def test_no_bare_state_outside_the_module_that_defines_them():
    sources = {name: path.read_text() for name, path in modules().items()}
    assert bare_states(sources) == [], "use launcher.states.JobState"


# --- sizes: a module that grows past these has more than one job (issue 46) -------------------------
MODULE_LINES, COMMAND_LINES = 450, 200


def oversized(sizes: dict[str, int]) -> list[str]:
    """'module: N lines' for each module over its limit (launcher.cli's: COMMAND_LINES)."""
    return [f"{name}: {lines} lines" for name, lines in sorted(sizes.items())
            if lines > (COMMAND_LINES if name.startswith("launcher.cli") else MODULE_LINES)]


def test_the_size_checker_holds_commands_to_the_smaller_limit():
    assert oversized({"launcher.cli.cmd_run": 201, "launcher.drill.trials": 449, "launcher.big": 451}) == \
        ["launcher.big: 451 lines", "launcher.cli.cmd_run: 201 lines"]


def test_no_module_outgrows_its_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert oversized(sizes) == []
