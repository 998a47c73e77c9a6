"""The checkpoints folder on disk: step folders, the atomic move into place, pruning, leftovers
of killed writers, each process's data file, and reading pieces back (NumPy only, no JAX)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .layout import intersect, relative, shape_of, size_of

FORMAT = "jaxlaunch-checkpoint"
VERSION = 2
PREFIX = "step-"
ALIGN = 64                   # bytes: every piece starts at a multiple of it in its data file
WRITE_CHUNK = 256 << 20      # one write() call at most; Linux caps a call just under 2 GiB


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, cut short or unreadable: restore() falls back to
    the previous one. (A `like=` that does not fit is the caller's error, not damage.)"""


def step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def data_file_name(process: int) -> str:
    return f"process-{process:05d}.data"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def write_data_file(path: Path, arrays) -> list[tuple[int, int]]:
    """Write the arrays one after another (each at an ALIGN boundary) straight from their memory,
    fsync, and return each one's (offset, nbytes). No intermediate copy: this is the disk's speed."""
    import numpy as np

    placed = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        for array in arrays:
            padding = -offset % ALIGN
            if padding:
                os.write(fd, b"\0" * padding)
                offset += padding
            raw = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            done = 0
            while done < len(raw):
                done += os.write(fd, raw[done:done + WRITE_CHUNK])
            placed.append((offset, len(raw)))
            offset += len(raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    return placed


def read_manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise DamagedCheckpoint(f"{folder}: unreadable manifest.json: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DamagedCheckpoint(f"{folder}: not a jaxlaunch checkpoint")
    if manifest.get("version", 1) > VERSION:
        raise CheckpointError(f"{folder}: written by a newer jaxlaunch (format version {manifest['version']}); "
                              f"upgrade jaxlaunch to read it")
    return manifest


class PieceReader:
    """Regions of a saved leaf, read from the pieces that overlap them. A piece needed whole is
    read straight into memory (one read call); a piece needed in part is memory-mapped, so a
    process reads only the bytes its devices need."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._maps: dict = {}

    def _where(self, piece: dict, dtype, path: str):
        held = tuple(map(tuple, piece["index"]))
        nbytes = size_of(held) * dtype.itemsize
        return self.folder / piece["file"], held, nbytes

    def _whole_piece(self, piece: dict, dtype, path: str):
        import numpy as np

        file, held, nbytes = self._where(piece, dtype, path)
        out = np.empty(shape_of(held), dtype)
        try:
            with open(file, "rb", buffering=0) as handle:
                handle.seek(piece["offset"])
                got = handle.readinto(memoryview(out.reshape(-1).view(np.uint8))) if nbytes else 0
        except OSError as exc:
            raise DamagedCheckpoint(f"{file}: {exc}") from None
        if got != nbytes:
            raise DamagedCheckpoint(f"{file} is cut short: leaf {path} needs bytes "
                                    f"{piece['offset']}..{piece['offset'] + nbytes}")
        return out

    def _mapped_piece(self, piece: dict, dtype, path: str):
        import numpy as np

        file, held, nbytes = self._where(piece, dtype, path)
        if file not in self._maps:
            try:
                self._maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
            except (OSError, ValueError) as exc:
                raise DamagedCheckpoint(f"{file}: {exc}") from None
        raw = self._maps[file][piece["offset"]:piece["offset"] + nbytes]
        if len(raw) != nbytes:
            raise DamagedCheckpoint(f"{file} is cut short: leaf {path} needs bytes "
                                    f"{piece['offset']}..{piece['offset'] + nbytes}")
        return raw.view(dtype).reshape(shape_of(held))

    def read(self, entry: dict, region) -> "np.ndarray":  # noqa: F821
        """The values of `region` of the leaf `entry` (a manifest leaf), as a new array."""
        import numpy as np

        from ...rundir.results import dtype_from_name

        dtype, path = dtype_from_name(entry["dtype"]), entry["path"]
        overlaps = []
        for piece in entry["pieces"]:
            held = tuple(map(tuple, piece["index"]))
            overlap = intersect(held, region)
            if overlap is not None and size_of(overlap):
                overlaps.append((piece, held, overlap))
        covered = sum(size_of(overlap) for _, _, overlap in overlaps)
        if covered != size_of(region):
            raise DamagedCheckpoint(f"{self.folder}: the pieces of leaf {path} cover {covered} of the "
                                    f"{size_of(region)} values asked for")
        if len(overlaps) == 1 and overlaps[0][1] == tuple(region):  # the same layout: one piece, one read
            return self._whole_piece(overlaps[0][0], dtype, path)
        out = np.empty(shape_of(region), dtype)
        for piece, held, overlap in overlaps:
            values = self._whole_piece(piece, dtype, path) if overlap == held else self._mapped_piece(piece, dtype, path)
            out[relative(overlap, region)] = values[relative(overlap, held)]
        return out


# --- the folder: atomic moves, pruning, leftovers -------------------------------------------

def old_step(path: Path) -> int | None:
    """The step of an `.old-step-N-PID` copy."""
    try:
        return int(path.name.split("-")[2])
    except (IndexError, ValueError):
        return None


def steps(directory: Path) -> list[int]:
    """Steps of the complete checkpoints, oldest first."""
    found = set()
    for path in directory.glob(f"{PREFIX}*"):
        if (path / "manifest.json").exists():
            try:
                found.add(int(path.name[len(PREFIX):]))
            except ValueError:
                continue
    return sorted(found)


def move_into_place(directory: Path, temp: Path, final: Path) -> None:
    old = None
    if final.exists():  # the same step again (a resumed run): keep the old one until the new is in
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    os.rename(temp, final)
    fsync_dir(directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(directory: Path, keep: int) -> None:
    for step in steps(directory)[:-keep]:
        path = directory / step_name(step)
        trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
        os.rename(path, trash)  # never a half-deleted step-* folder
        shutil.rmtree(trash, ignore_errors=True)
    # An .old- copy (a replacing save stopped between its renames) is needed only while it is
    # newer than the steps kept; once older, it would outlive `keep` forever.
    kept = steps(directory)
    for path in directory.glob(".old-*"):
        step = old_step(path)
        if step is None or step in kept or (kept and step < kept[0]):
            shutil.rmtree(path, ignore_errors=True)


def clean_leftovers(directory: Path) -> None:
    """Folders a killed writer left behind (.tmp-, .trash-; .old- once its step is back)."""
    if not directory.exists():
        return
    complete = set(steps(directory))
    for path in directory.glob(".*"):
        if path.name.startswith((".tmp-", ".trash-")):
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(".old-") and old_step(path) in complete:
            shutil.rmtree(path, ignore_errors=True)


def candidates(directory: Path) -> list[Path]:
    """Complete checkpoint folders, newest first (an `.old-` copy only when its step is gone)."""
    folders = {step: directory / step_name(step) for step in steps(directory)}
    for path in directory.glob(".old-*"):
        step = old_step(path)
        if step is not None and step not in folders and (path / "manifest.json").exists():
            folders[step] = path
    return [folders[s] for s in sorted(folders, reverse=True)]
