"""Each run of the drill in a fresh copy of the working directory (issue 51, finding 8): a program
that keeps its own checkpoint there (`ckpt/`, `state.pkl`) would otherwise resume the next trial
from the last one's, and the drill would score a restart it never tested. The copies are made from
the working directory as it was when the drill started, under DRILL_DIR/workdirs/NAME.

Some things are shared with the original, not copied, and the drill says which: `.git`, jaxlaunch's
own `runs/`, virtual environments and `node_modules` (symbolic links to the originals), and any file
over SHARED_FILE_BYTES. A working directory too large to copy (COPY_LIMIT_BYTES, COPY_LIMIT_FILES)
is shared whole, and the drill says that too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...rundir import RUNS_ROOT

SHARED_FILE_BYTES = 64 * 2**20
COPY_LIMIT_BYTES = 2 * 2**30
COPY_LIMIT_FILES = 20_000
SHARED_FOLDERS = (".git", RUNS_ROOT, "node_modules")


class WorkdirCopies:
    def __init__(self, source: Path, drill_folder: Path):
        self.source, self.drill_folder = source.resolve(), drill_folder.resolve()
        self.copies: dict[Path, Path] = {}  # run directory -> its copy
        self.folders: list[str] = []  # copied as folders, empty ones too
        self.shared, self.copied, self.whole = self._plan()

    def _plan(self) -> tuple[list[str], list[str], bool]:
        """(shared paths, copied files, relative to the source; whether the whole directory is shared)."""
        shared, copied, size = [], [], 0
        for folder, subfolders, files in os.walk(self.source):
            here = Path(folder)
            for name in list(subfolders):
                path = here / name
                if path == self.drill_folder:
                    subfolders.remove(name)
                elif name in SHARED_FOLDERS or (path / "pyvenv.cfg").exists() or path.is_symlink():
                    subfolders.remove(name)
                    (copied if path.is_symlink() else shared).append(str(path.relative_to(self.source)))
                else:
                    self.folders.append(str(path.relative_to(self.source)))
            for name in files:
                path = here / name
                try:
                    bytes_ = 0 if path.is_symlink() else path.stat().st_size
                except OSError:
                    continue
                if bytes_ > SHARED_FILE_BYTES:
                    shared.append(str(path.relative_to(self.source)))
                else:
                    copied.append(str(path.relative_to(self.source)))
                    size += bytes_
            if size > COPY_LIMIT_BYTES or len(copied) > COPY_LIMIT_FILES:
                return [], [], True
        return sorted(shared), copied, False

    def describe(self) -> str:
        if self.whole:
            return (f"every run works in {self.source} itself: it is too large to copy (over {COPY_LIMIT_FILES} files "
                    f"or {COPY_LIMIT_BYTES >> 30} GiB), so what a run leaves there (a checkpoint) the next one finds")
        line = f"every run works in a fresh copy of {self.source} ({self.drill_folder / 'workdirs'})"
        if self.shared:
            line += "; shared with the original, not copied: " + ", ".join(self.shared)
        return line

    def report(self) -> dict:
        return {"source": str(self.source), "copied": not self.whole, "shared": ["."] if self.whole else self.shared}

    def for_run(self, run_dir: Path) -> Path:
        """The working directory of a run (the same for its resumption): a fresh copy, made once."""
        if self.whole:
            return self.source
        run_dir = Path(run_dir)
        if run_dir not in self.copies:
            copy = self.drill_folder / "workdirs" / run_dir.name
            if copy.exists():
                shutil.rmtree(copy)
            copy.mkdir(parents=True)
            for relative in self.folders:
                (copy / relative).mkdir(parents=True, exist_ok=True)
            for relative in self.shared:
                link = copy / relative
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(self.source / relative)
            for relative in self.copied:
                target = copy / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                original = self.source / relative
                if original.is_symlink():
                    target.symlink_to(os.readlink(original))
                elif original.is_file():  # not a socket or a fifo
                    shutil.copy2(original, target)
            self.copies[run_dir] = copy
        return self.copies[run_dir]

    def counterpart(self, path: str, copy: Path) -> str:
        """`path` (relative to the drill's own working directory) as the run in `copy` must name it."""
        absolute = Path(os.path.abspath(path))
        try:
            return str(copy / absolute.relative_to(self.source))
        except ValueError:
            return str(absolute)
