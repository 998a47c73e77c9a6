"""What ran, recorded when a run directory is made (on the submitting machine, before any queue wait;
RunDirectory.create writes it, under the names of launcher/rundir/names.py):

    environment.json   Python, every installed package's version, the job folder's git commit
    git.diff           the job folder's uncommitted changes (`git diff HEAD`), when there are any
    code/              with `snapshot: true`: a copy of the job's code, which the ranks run, so
                       edits made while the job waits in the queue do not leak into it

The job's folder is the entrypoint file's folder, else (a module, a function job) the working
directory. Packages and git are looked up once per process (a sweep records the same for every task).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

# A snapshot copies code, not data: these kinds of file, outside hidden folders, caches, run
# directories and virtual environments, up to SNAPSHOT_LIMIT bytes in all.
CODE_SUFFIXES = {".py", ".yaml", ".yml", ".json", ".toml", ".cfg", ".ini", ".txt", ".sh", ".j2"}
SKIPPED_FOLDERS = {"__pycache__", "runs", "node_modules", "site-packages"}
SNAPSHOT_LIMIT = 50 * 2**20


def job_folder(spec) -> Path:
    file = spec.entrypoint_file
    return file.parent if file is not None and file.is_absolute() else Path.cwd()


@functools.lru_cache(maxsize=None)
def installed_packages() -> dict[str, str]:
    """{distribution name: version} from the *.dist-info folder names on sys.path: ~1 ms, where
    importlib.metadata.distributions() reads every METADATA file (80 ms here)."""
    found = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info"):
                package, _, version = name[:-len(".dist-info")].partition("-")
                found.setdefault(package.lower().replace("_", "-"), version)
    return dict(sorted(found.items()))


def _git(folder: Path, *args) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def git_state(folder: Path) -> tuple[dict | None, str]:
    """({root, commit, branch, dirty}, the diff of the folder's uncommitted changes), or (None,
    "") outside a git repository."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top is None:
        return None, ""
    commit = (_git(folder, "rev-parse", "HEAD") or "").strip() or None
    branch = (_git(folder, "rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None
    changed = _git(folder, "status", "--porcelain", "--", ".") or ""
    diff = (_git(folder, "diff", "HEAD", "--", ".") or "") if changed else ""
    return {"root": top.strip(), "folder": str(folder), "commit": commit, "branch": branch,
            "dirty": bool(changed.strip()),
            "untracked": [line[3:] for line in changed.splitlines() if line.startswith("??")][:100]}, diff


def environment_record(spec) -> tuple[dict, str]:
    """(what environment.json holds, the job folder's uncommitted diff or "")."""
    from . import __version__

    folder = job_folder(spec)
    git, diff = git_state(folder)
    return {"time": time.time(), "host": platform.node(), "jaxlaunch": __version__,
            "python": platform.python_version(), "python_executable": sys.executable,
            "platform": platform.platform(), "working_directory": os.getcwd(), "job_folder": str(folder),
            "git": git, "packages": installed_packages(), "snapshot": bool(getattr(spec, "snapshot", False))}, diff


def _code_files(folder: Path, skip: Path) -> list[Path]:
    files, total = [], 0
    for root, folders, names in os.walk(folder):
        here = Path(root)
        folders[:] = sorted(d for d in folders if not d.startswith(".") and d not in SKIPPED_FOLDERS
                            and not (here / d / "pyvenv.cfg").exists() and here / d != skip)
        for name in sorted(names):
            path = here / name
            if path.suffix in CODE_SUFFIXES and path.is_file():
                total += path.stat().st_size
                if total > SNAPSHOT_LIMIT:
                    from .errors import UsageError

                    raise UsageError(f"snapshot: the job's folder {folder} holds more than "
                                     f"{SNAPSHOT_LIMIT // 2**20} MiB of code files ({', '.join(sorted(CODE_SUFFIXES))}).\n"
                                     f"  fix: put the job's code in a folder of its own, or set snapshot: false.")
                files.append(path)
    return files


def snapshot_code(spec, run_path: Path, code: Path):
    """Copy the job's code into `code` (RUN_DIR/code: RunDirectory.code; the run directory itself
    is not copied, where it lies in the job's folder) and return the spec that runs the copy: a file
    entrypoint points into it; a module is imported from it (rank/bootstrap.py puts it first
    on sys.path). The run directory's names are launcher/rundir/names.py's."""
    folder = job_folder(spec)
    code = Path(code)
    for path in _code_files(folder, skip=Path(run_path)):
        destination = code / path.relative_to(folder)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
    code.mkdir(exist_ok=True)
    file = spec.entrypoint_file
    if file is not None and file.is_absolute():
        copy = code / file.relative_to(folder)
        if spec.runs_program:
            return spec.replace(entrypoint=str(copy))
        return spec.replace(entrypoint=f"{copy}:{spec.entrypoint.rpartition(':')[2]}")
    return spec
