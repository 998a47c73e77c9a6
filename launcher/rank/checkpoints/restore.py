"""How a checkpoint's leaves are read back (the restore side of `Checkpoints`; `restore()` and
`load()` themselves: manager.py): the tree to rebuild and the reader of its pieces (format 2, or
format 1's npz files), then each leaf onto like='s sharding or the saved one, each region read once.
"""

from __future__ import annotations

from pathlib import Path

from .layout import normalize, relative, whole
from .layout import sharding_from_description
from .storage import CheckpointError, DamagedCheckpoint, PieceReader
from .tree import is_jax_array


class LeafRestorer:
    """The restore side of `Checkpoints`: a folder's tree and reader, and one leaf restored (with
    the `rank` and `mesh` that `Checkpoints` sets)."""

    def _tree_and_reader(self, folder: Path, manifest: dict):
        if manifest.get("version", 1) == 1:
            return manifest, _NpzReader(folder, manifest, self.rank)
        if manifest.get("per_rank"):
            ranks = manifest["ranks"]
            if self.rank >= len(ranks):
                raise CheckpointError(f"{folder} holds per-rank state of {len(ranks)} processes and this is rank "
                                      f"{self.rank}: per-rank state restores onto the same number of processes")
            return ranks[self.rank], PieceReader(folder)
        return manifest, PieceReader(folder)

    def _restore_leaf(self, reader, entry: dict, devices, like=None):
        import jax

        kind, shape, path = entry["kind"], tuple(entry["shape"]), entry["path"]
        if is_jax_array(like):  # its layout, so its shape too; a NumPy like (a growing list of losses) need not
            if tuple(like.shape) != shape:
                raise CheckpointError(f"leaf {path}: saved with shape {shape}, like= has {tuple(like.shape)}")
            sharding = like.sharding
        elif like is not None or kind != "jax":
            value = reader.read(entry, whole(shape))
            if kind == "python":
                return {"int": int, "float": float, "bool": bool}[entry["python_type"]](value.item())
            return value[()] if kind == "numpy_scalar" else value
        else:
            try:
                sharding = sharding_from_description(entry.get("sharding") or {}, devices, self.mesh, path)
            except ValueError as exc:
                raise CheckpointError(str(exc)) from None
        regions: dict = {}  # one read per region, however many devices hold it

        def values_at(index):
            region = normalize(index, shape)
            if region not in regions:
                regions[region] = reader.read(entry, region)
            return regions[region]

        return jax.make_array_from_callback(shape, sharding, values_at)


class _NpzReader:
    """Checkpoints of format version 1 (one arrays.npz, or one per rank): read whole leaves."""

    def __init__(self, folder: Path, manifest: dict, rank: int):
        self.path = folder / (f"arrays-rank-{rank}.npz" if manifest.get("per_rank") else "arrays.npz")
        self._arrays = None

    def read(self, entry: dict, region):
        import numpy as np

        from ...rundir.results import dtype_from_name

        if self._arrays is None:
            try:
                with np.load(self.path, allow_pickle=False) as stored:
                    self._arrays = {key: stored[key] for key in stored.files}
            except (OSError, ValueError) as exc:
                raise DamagedCheckpoint(f"{self.path}: {exc}") from None
        if entry["key"] not in self._arrays:
            raise DamagedCheckpoint(f"{self.path}: no {entry['key']} (leaf {entry['path']})")
        stored, dtype = self._arrays[entry["key"]], dtype_from_name(entry["dtype"])
        array = (stored.view(dtype) if stored.dtype != dtype else stored).reshape(entry["shape"])
        return np.array(array[relative(region, whole(array.shape))])

