"""mpi4jax's own test suite on 2 ranks, under `jaxlaunch run` (pytest as the entrypoint) and under
plain `mpirun -n 2 python -m pytest`, as mpi4jax's CI runs it (issue 51, finding 10: it passed
under mpirun and lost a rank to SIGSEGV under jaxlaunch). Not part of `make test` (a few minutes
on the 2-core machine kind):

    make mpi4jax-suite          # or: .venv/bin/python tests/mpi4jax_suite.py [--only mpirun|jaxlaunch]

The suite is the tests/ and examples/ of the installed mpi4jax's own sdist (pip download, into
build/mpi4jax-suite/). Prints each run's exit code, pytest's summary line of each rank and the wall
time; exits 0 when both runs pass with the same counts on each rank.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SUMMARY = re.compile(r"^(\[rank \d\] )?=+ (.*\b(?:passed|failed|errors?)\b.*?) in [\d.]+s")
PYTEST_ARGS = ["-p", "no:cacheprovider", "--color=no", "tests"]


def fetch_suite(folder: Path) -> Path:
    """tests/ and examples/ of the installed mpi4jax's sdist, unpacked under `folder`."""
    from importlib.metadata import version

    wanted = version("mpi4jax")
    suite = folder / f"mpi4jax-{wanted}"
    if (suite / "tests").is_dir():
        return suite
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "mpi4jax",
                    f"mpi4jax=={wanted}", "-d", str(folder)], check=True)
    with tarfile.open(folder / f"mpi4jax-{wanted}.tar.gz") as sdist:
        members = [m for m in sdist.getmembers() if m.isfile() and m.name.split("/")[1:2] in (["tests"], ["examples"])]
        sdist.extractall(folder, members=members)  # noqa: S202  (mpi4jax's own sdist, from PyPI)
    return suite


def summaries(output: str) -> list[str]:
    """pytest's summary of each rank ('108 passed, 4 skipped'), sorted: mpirun interleaves the ranks'
    lines without saying whose they are."""
    return sorted(match.group(2) for match in map(SUMMARY.match, output.splitlines()) if match)


def run(name: str, argv: list, cwd: Path, env: dict) -> dict:
    started = time.monotonic()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    found = summaries(output)
    print(f"{name}: exit {result.returncode} in {seconds:.0f} s; the ranks' pytest: {' | '.join(found)}", flush=True)
    if result.returncode != 0:
        print("\n".join(output.splitlines()[-40:]), flush=True)
    return {"code": result.returncode, "counts": found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["mpirun", "jaxlaunch"])
    parser.add_argument("--folder", default=str(ROOT / "build" / "mpi4jax-suite"))
    args = parser.parse_args()
    suite = fetch_suite(Path(args.folder))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("XLA_FLAGS", None)
    results = {}
    if args.only in (None, "mpirun"):
        sys.path.insert(0, str(ROOT))
        from launcher.launchers.mpirun import find_mpirun, local_mpirun_argv

        argv = local_mpirun_argv(find_mpirun(), 2, os.geteuid() == 0, [sys.executable, "-m", "pytest", *PYTEST_ARGS])
        results["mpirun"] = run("mpirun -n 2 python -m pytest tests", argv, suite, env)
    if args.only in (None, "jaxlaunch"):
        spec = suite / "jaxlaunch-suite.yaml"
        spec.write_text("name: mpi4jax-suite\nentrypoint: pytest\n"
                        f"args: [{', '.join(PYTEST_ARGS)}]\nprocesses_per_node: 2\n")
        shutil.rmtree(suite / "run", ignore_errors=True)
        argv = [str(BIN / "jaxlaunch"), "run", str(spec), "--run-dir", str(suite / "run")]
        results["jaxlaunch"] = run("jaxlaunch run (pytest, 2 ranks)", argv, suite, env)
    ok = all(r["code"] == 0 and len(r["counts"]) == 2 for r in results.values())
    if len(results) == 2:
        ok = ok and results["mpirun"]["counts"] == results["jaxlaunch"]["counts"]
    print("same results under jaxlaunch as under mpirun" if ok else "NOT the same", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
