"""The path of a spec from `jaxlaunch submit` to sbatch, module by module (issue 46: "today it passes
through 9 modules and comes back to one it had left 12 times, 5 of them from a lower layer back up to a
higher one"). Runs `jaxlaunch submit SPEC` in this process with Slurm's answers canned at the one
wrapper every Slurm command goes through (scheduler.call_slurm), and records every call into a
launcher module (sys.setprofile) until sbatch:

- modules: the launcher modules the path calls into;
- re-entries: calls into a module the path had called into before and left since;
- upward: those of them whose caller sits in a lower layer than the callee (a module's layer: the
  longest chain of launcher imports below it, so a module that imports another is above it).

    .venv/bin/python tests/seam_path.py [SPEC]      (default: jobs' normalize example)

Run it on two checkouts to compare them (PYTHONPATH=OTHER_CHECKOUT picks the launcher measured).
"""
import ast
import sys
from pathlib import Path

from click.testing import CliRunner

import launcher
from launcher.backends.slurm import scheduler

PACKAGE = Path(launcher.__file__).parent
PARTITION = ("PartitionName=debug Default=YES TotalNodes=2 MaxNodes=UNLIMITED MaxTime=UNLIMITED DefaultTime=NONE "
             "State=UP Nodes=node[1-2]")
NODES = "NodeName=node1 Partitions=debug CPUTot=4 RealMemory=8000 Gres=(null)\n" \
        "NodeName=node2 Partitions=debug CPUTot=4 RealMemory=8000 Gres=(null)"
CONFIG = "AuthInfo = cred_expire=10\nSchedulerParameters = (null)\nSlurmctldParameters = (null)\n" \
         "SLURM_VERSION = 22.05.8\nMaxArraySize = 1001\n"


def answer(argv, timeout=None, **kwargs):
    if argv[:3] == ["scontrol", "show", "partition"]:
        return PARTITION
    if argv[:3] == ["scontrol", "show", "node"]:
        return NODES
    if argv[:3] == ["scontrol", "show", "config"]:
        return CONFIG
    if argv[0] == "sbatch":
        raise StopIteration  # the end of the path
    return ""


def layers() -> dict[str, int]:
    """Module -> the longest chain of launcher imports below it (0: imports no launcher module)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                prefix = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                found.update(f"{prefix}.{a.name}" for a in node.names)
                found.add(prefix)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = found
    names = set(graph)
    graph = {k: {v for v in vs if v in names and v != k} for k, vs in graph.items()}
    memo = {}

    def depth(name, seen=()):
        if name in memo:
            return memo[name]
        if name in seen:
            return 0
        memo[name] = 1 + max((depth(d, (*seen, name)) for d in graph[name]), default=-1)
        return memo[name]

    return {name: depth(name) for name in graph}


def main(spec: str) -> None:
    from launcher.cli import main as cli

    calls = []  # (caller module, callee module)

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if callee.startswith("launcher") and callee != caller:
            calls.append((caller, callee))

    scheduler.call_slurm = answer
    sys.setprofile(profile)
    try:
        CliRunner().invoke(cli, ["submit", spec, "--run-dir", "/tmp/seam-path-run"], catch_exceptions=True)
    finally:
        sys.setprofile(None)
    import shutil

    shutil.rmtree("/tmp/seam-path-run", ignore_errors=True)
    rank = layers()
    report(calls, rank, "modules")
    packages = {name: name if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()
                else name.rpartition(".")[0] for pair in calls for name in pair if name.startswith("launcher")}
    package_calls = [(packages.get(a, a), packages[b]) for a, b in calls if packages.get(a, a) != packages[b]]
    report(package_calls, {p: max((r for m, r in rank.items() if packages.get(m) == p), default=0)
                           for p in set(packages.values())}, "packages")


def report(calls, rank, what):
    visited, order, reentries, upward = [], [], 0, 0
    for caller, callee in calls:
        if callee in visited and (not order or order[-1] != callee):
            reentries += 1
            if caller.startswith("launcher") and rank.get(caller, 0) < rank.get(callee, 0):
                upward += 1
        if callee not in visited:
            visited.append(callee)
        order.append(callee)
    print(f"{what}: {len(visited)}, {reentries} re-entries, {upward} of them upward")
    print("  " + " -> ".join(visited))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(next(Path("jobs").rglob("normalize.yaml"))))
