"""Checkpoints for job authors: `ctx.checkpoints.save(step, state)` / `.restore()`.

Format (one folder per step, readable without jaxlaunch; see README "Checkpoints"):

    RUN_DIR/checkpoints/step-00000042/
        manifest.json   step, time, metadata, the tree's structure, and per leaf: kind, dtype,
                        shape and sharding
        arrays.npz      every leaf as a NumPy array, under leaf_0, leaf_1, ... (np.load reads it)
        arrays-rank-N.npz  instead, with save(..., per_rank=True): each rank's own leaves

Atomic: everything is written into a hidden `.tmp-step-...` folder, each file fsynced, then
the folder is renamed into place (a rename is atomic), so a kill -9 at any moment leaves the
previous checkpoint whole. `restore()` only ever sees complete folders.

Who writes: mpi4jax jobs keep their state replicated in every process, so rank 0 alone writes
and the other ranks wait for its outcome (one broadcast: nobody reads a half-made checkpoint,
and a failed write raises on every rank). `per_rank=True` is for state that differs by process.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

FORMAT = "jaxlaunch-checkpoint"
VERSION = 1
PREFIX = "step-"

log = logging.getLogger("jaxlaunch.checkpoints")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


def _step_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_jax_array(value) -> bool:
    jax = __import__("sys").modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


# --- the tree's structure, as JSON ----------------------------------------------------------

def _flatten(state):
    """(paths, leaves, structure). Plain trees (dict with str keys, list, tuple, None) need no
    JAX and give a JSON structure; anything else goes through jax.tree_util (structure None)."""
    paths, leaves = [], []

    def walk(node, path):
        if isinstance(node, dict) and all(isinstance(k, str) for k in node) and type(node) is dict:
            return {"dict": [[k, walk(v, f"{path}[{k!r}]")] for k, v in sorted(node.items())]}
        if type(node) in (list, tuple):
            kind = "list" if type(node) is list else "tuple"
            return {kind: [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if node is None:
            return {"none": True}
        if _is_leaf(node):
            paths.append(path)
            leaves.append(node)
            return {"leaf": len(leaves) - 1}
        raise _NotPlain

    try:
        structure = walk(state, "")
        return paths, leaves, structure
    except _NotPlain:
        import jax

        with_paths, _ = jax.tree_util.tree_flatten_with_path(state)
        return [jax.tree_util.keystr(p) for p, _ in with_paths], [leaf for _, leaf in with_paths], None


class _NotPlain(Exception):
    pass


def _is_leaf(value) -> bool:
    import numpy as np

    return isinstance(value, (int, float, bool, np.ndarray, np.generic)) or _is_jax_array(value)


def _unflatten(structure, leaves):
    if "leaf" in structure:
        return leaves[structure["leaf"]]
    if "none" in structure:
        return None
    if "dict" in structure:
        return {k: _unflatten(v, leaves) for k, v in structure["dict"]}
    if "list" in structure:
        return [_unflatten(v, leaves) for v in structure["list"]]
    return tuple(_unflatten(v, leaves) for v in structure["tuple"])


# --- leaves -------------------------------------------------------------------------------

def _describe_sharding(array, devices) -> dict:
    """Enough to rebuild the sharding on this process's devices: for a NamedSharding the mesh's
    axis names, shape and devices (as indices into the local device list) and the spec. pmap
    outputs are NamedShardings too in JAX 0.10 (axis `_internal_pmap_axis_name`)."""
    from jax.sharding import NamedSharding, SingleDeviceSharding

    devices = list(devices)
    sharding = array.sharding
    if isinstance(sharding, SingleDeviceSharding):
        device = next(iter(sharding.device_set))
        return {"type": "single", "device": devices.index(device) if device in devices else 0}
    if isinstance(sharding, NamedSharding) and hasattr(sharding.mesh, "devices"):
        mesh = sharding.mesh
        return {"type": "named", "axes": list(mesh.axis_names), "mesh_shape": list(mesh.devices.shape),
                "devices": [devices.index(d) for d in mesh.devices.flat],
                "spec": [list(p) if isinstance(p, tuple) else p for p in sharding.spec]}
    if sharding.is_fully_replicated:
        return {"type": "replicated"}
    raise ValueError(f"cannot describe the sharding {sharding}; pass restore(like=...) with an array laid out the same")


def _encode_leaf(value, path, devices, mesh):
    """(numpy array to store, manifest entry)."""
    import numpy as np

    from ..results import _is_ml_dtype

    if isinstance(value, bool) or isinstance(value, (int, float)) and not isinstance(value, np.generic):
        entry = {"kind": "python", "python_type": type(value).__name__}
        array = np.asarray(value)
    elif isinstance(value, np.generic):
        entry = {"kind": "numpy_scalar"}
        array = np.asarray(value)
    elif isinstance(value, np.ndarray):
        entry = {"kind": "numpy"}
        array = value
    else:  # a jax.Array
        if not value.is_fully_addressable:
            raise ValueError(f"checkpoint leaf {path}: an array spread over several processes (a global mesh) "
                             f"cannot be saved by one rank; save each process's local part with per_rank=True")
        import jax

        entry = {"kind": "jax", "sharding": _describe_sharding(value, devices or jax.local_devices())}
        array = np.asarray(value)
    if array.dtype.hasobject:
        raise ValueError(f"checkpoint leaf {path}: an array of Python objects; checkpoints hold numbers only")
    entry.update(path=path, dtype=array.dtype.name, shape=list(array.shape))
    if _is_ml_dtype(array.dtype):  # bfloat16 & co: npz cannot name them; keep the bits
        array = array.view(np.dtype(f"u{array.dtype.itemsize}"))
    return array, entry


def _decode_leaf(stored, entry, devices, mesh, like=None):
    import numpy as np

    from ..results import _dtype

    dtype = _dtype(entry["dtype"])
    array = stored.view(dtype) if stored.dtype != dtype else stored
    array = array.reshape(entry["shape"])
    kind = entry["kind"]
    if kind == "python":
        return {"int": int, "float": float, "bool": bool}[entry["python_type"]](array.item())
    if kind == "numpy_scalar":
        return array[()]
    if kind == "numpy":
        return array
    import jax

    if like is not None and _is_jax_array(like):
        return jax.device_put(array, like.sharding)
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = entry.get("sharding") or {"type": "single", "device": 0}
    devices = list(devices if devices is not None else jax.local_devices())
    if sharding["type"] == "named":
        grid = np.array([devices[i] for i in sharding["devices"]]).reshape(sharding["mesh_shape"])
        spec = [tuple(p) if isinstance(p, list) else p for p in sharding["spec"]]
        return jax.device_put(array, NamedSharding(Mesh(grid, tuple(sharding["axes"])), PartitionSpec(*spec)))
    if sharding["type"] == "replicated":
        mesh = mesh if mesh is not None else Mesh(np.array(devices), ("devices",))
        return jax.device_put(array, NamedSharding(mesh, PartitionSpec()))
    return jax.device_put(array, devices[min(sharding.get("device", 0), len(devices) - 1)])


# --- the public class ---------------------------------------------------------------------

class Checkpoints:
    """The checkpoints of one run: `ctx.checkpoints` in a job (see the module doc)."""

    def __init__(self, directory, keep: int = 2, rank: int = 0, comm=None, devices=None, mesh=None):
        self.directory = Path(directory)
        self.keep, self.rank, self.comm = keep, rank, comm
        self.devices, self.mesh = devices, mesh

    # collective steps, counted for the hang watchdog like every launcher collective
    def _collective(self, name, call, *args, **kwargs):
        if self.comm is None or self.comm.Get_size() == 1:
            return call(*args, **kwargs)
        from .tracker import TRACKER

        seq = TRACKER.start(name)
        TRACKER.enter(seq, name)
        try:
            return getattr(self.comm, call)(*args, **kwargs) if isinstance(call, str) else call(*args, **kwargs)
        finally:
            TRACKER.leave()

    def _bcast(self, value):
        if self.comm is None or self.comm.Get_size() == 1:
            return value
        return self._collective("checkpoint", "bcast", value, root=0)

    def _gather(self, value):
        if self.comm is None or self.comm.Get_size() == 1:
            return [value]
        return self._collective("checkpoint", "gather", value, root=0)

    # --- reading the folder ---

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        found = set()
        for path in self.directory.glob(f"{PREFIX}*"):
            if (path / "manifest.json").exists():
                try:
                    found.add(int(path.name[len(PREFIX):]))
                except ValueError:
                    continue
        return sorted(found)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # --- save ---

    def save(self, step: int, state, metadata: dict | None = None, per_rank: bool = False) -> Path:
        """Write `state` (any pytree of arrays and numbers) as checkpoint `step`; every rank calls it."""
        started = time.perf_counter()
        final = self.directory / _step_name(int(step))
        temp = self.directory / f".tmp-{_step_name(int(step))}-{os.getpid()}"
        error = None
        try:
            json.dumps(metadata or {})
        except (TypeError, ValueError) as exc:
            error = f"checkpoint metadata must be JSON: {exc}"
        size = 0
        if error is None and self.rank == 0:
            try:
                self._clean_leftovers()
                temp.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                error = f"cannot create {temp}: {exc}"
        error, temp = self._bcast((error, temp))  # rank 0's folder, made before any rank writes into it
        entries = None
        if error is None and (self.rank == 0 or per_rank):
            try:
                entries, structure, size = self._write_arrays(temp, state, per_rank)
            except Exception as exc:  # noqa: BLE001  (reported to every rank below)
                error = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        errors = self._gather(error) if per_rank else [error]
        if self.rank == 0:
            error = next((e for e in errors or [] if e), None)
            if error is None:
                try:
                    manifest = {"format": FORMAT, "version": VERSION, "step": int(step), "time": time.time(),
                                "metadata": metadata or {}, "per_rank": per_rank,
                                "num_ranks": 1 if self.comm is None else self.comm.Get_size(),
                                "structure": structure, "leaves": entries}
                    self._write_file(temp / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
                    _fsync_dir(temp)
                    self._move_into_place(temp, final)
                    self._prune()
                except Exception as exc:  # noqa: BLE001
                    error = f"rank 0: {type(exc).__name__}: {exc}"
        error = self._bcast(error)
        if error is not None:
            if self.rank == 0:
                shutil.rmtree(temp, ignore_errors=True)
            raise CheckpointError(f"checkpoint step {step} in {self.directory} not saved: {error}")
        seconds = time.perf_counter() - started
        if self.rank == 0:
            log.info("checkpoint step %d saved in %.3f s (%d bytes)", step, seconds, size)
            _log_event("checkpoint", step=int(step), seconds=round(seconds, 4), bytes=size)
        return final

    def _write_arrays(self, folder: Path, state, per_rank: bool):
        import io

        import numpy as np

        paths, leaves, structure = _flatten(state)
        arrays, entries = {}, []
        for index, (path, leaf) in enumerate(zip(paths, leaves)):
            array, entry = _encode_leaf(leaf, path, self.devices, self.mesh)
            entry["key"] = f"leaf_{index}"
            arrays[entry["key"]] = array
            entries.append(entry)
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        name = f"arrays-rank-{self.rank}.npz" if per_rank else "arrays.npz"
        self._write_file(folder / name, buffer.getvalue())
        return entries, structure, buffer.tell()

    @staticmethod
    def _write_file(path: Path, data: bytes) -> None:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def _move_into_place(self, temp: Path, final: Path) -> None:
        old = None
        if final.exists():  # the same step again (a resumed run): keep the old one until the new is in
            old = final.with_name(f".old-{final.name}-{os.getpid()}")
            os.rename(final, old)
        os.rename(temp, final)
        _fsync_dir(self.directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _prune(self) -> None:
        for step in self.steps()[:-self.keep]:
            path = self.directory / _step_name(step)
            trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
            os.rename(path, trash)  # never a half-deleted step-* folder
            shutil.rmtree(trash, ignore_errors=True)
        # An .old- copy (a replacing save stopped between its renames) is needed only while it is
        # newer than the steps kept; once older, it would outlive `keep` forever.
        kept = self.steps()
        for path in self.directory.glob(".old-*"):
            step = _old_step(path)
            if step is None or step in kept or (kept and step < kept[0]):
                shutil.rmtree(path, ignore_errors=True)

    def _clean_leftovers(self) -> None:
        """Folders a killed writer left behind (.tmp-, .trash-; .old- once its step is back)."""
        if not self.directory.exists():
            return
        complete = set(self.steps())
        for path in self.directory.glob(".*"):
            if path.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith(".old-"):
                step = _old_step(path)
                if step in complete:
                    shutil.rmtree(path, ignore_errors=True)

    # --- restore ---

    def _candidates(self) -> list[Path]:
        """Complete checkpoint folders, newest first (an `.old-` copy only when its step is gone)."""
        folders = {step: self.directory / _step_name(step) for step in self.steps()}
        for path in self.directory.glob(".old-*"):
            step = _old_step(path)
            if step is not None and step not in folders and (path / "manifest.json").exists():
                folders[step] = path
        return [folders[s] for s in sorted(folders, reverse=True)]

    def restore(self, like=None):
        """(step, state) of the newest checkpoint that loads, or None when there is none. With
        `like` (e.g. the freshly initialised state), its structure and shardings are used."""
        choice = None
        if self.rank == 0 or self.comm is None:
            for folder in self._candidates():
                try:
                    _read_manifest(folder)
                    choice = str(folder)
                    break
                except CheckpointError as exc:
                    log.warning("skipping checkpoint %s: %s", folder, exc)
        choice = self._bcast(choice)
        if choice is None:
            return None
        error, value = None, None
        try:
            value = self.load(choice, like=like)
        except Exception as exc:  # noqa: BLE001
            error = f"rank {self.rank}: {exc}"
        errors = self._gather(error)
        error = self._bcast(next((e for e in errors or [] if e), None) if self.rank == 0 else None)
        if error is not None:
            raise CheckpointError(f"cannot restore {choice}: {error}")
        if self.rank == 0:
            _log_event("restored", step=value[0], folder=choice)
            log.info("restored checkpoint step %d from %s", value[0], choice)
        return value

    def load(self, folder, like=None):
        """(step, state) from one checkpoint folder, on this process alone."""
        import numpy as np

        folder = Path(folder)
        manifest = _read_manifest(folder)
        name = f"arrays-rank-{self.rank}.npz" if manifest["per_rank"] else "arrays.npz"
        try:
            with np.load(folder / name, allow_pickle=False) as stored:
                raw = [stored[entry["key"]] for entry in manifest["leaves"]]
        except (OSError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{folder / name}: {exc}") from None
        entries = manifest["leaves"]
        if like is not None:
            paths, like_leaves, _ = _flatten(like)
            saved = [e["path"] for e in entries]
            if paths != saved:
                first = next((f"{a!r} vs saved {b!r}" for a, b in zip(paths, saved) if a != b),
                             f"{len(paths)} leaves vs {len(saved)} saved")
                raise CheckpointError(f"{folder}: the tree passed as like= does not match the checkpoint: {first}")
            leaves = [_decode_leaf(r, e, self.devices, self.mesh, l) for r, e, l in zip(raw, entries, like_leaves)]
            import jax

            return manifest["step"], jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
        if manifest["structure"] is None:
            raise CheckpointError(f"{folder}: the saved tree has node types JSON cannot describe (a namedtuple, a "
                                  f"custom pytree); pass restore(like=initial_state) to rebuild it")
        leaves = [_decode_leaf(r, e, self.devices, self.mesh) for r, e in zip(raw, entries)]
        return manifest["step"], _unflatten(manifest["structure"], leaves)


def _old_step(path: Path) -> int | None:
    try:
        return int(path.name.split("-")[2])
    except (IndexError, ValueError):
        return None


def _read_manifest(folder: Path) -> dict:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: unreadable manifest.json: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder}: not a jaxlaunch checkpoint")
    return manifest


def _log_event(event: str, **fields) -> None:
    from .environment import RUN_DIR_ENV

    if os.environ.get(RUN_DIR_ENV):
        from ..rundir import RunDirectory

        RunDirectory(os.environ[RUN_DIR_ENV]).log_event(event, **fields)


def load_checkpoint(path, like=None):
    """(step, state) from a checkpoint folder, or the newest one in a checkpoints folder, in any
    Python process (no MPI, no jaxlaunch run): what a notebook needs."""
    path = Path(path)
    if (path / "manifest.json").exists():
        return Checkpoints(path.parent).load(path, like=like)
    restored = Checkpoints(path).restore(like=like)
    if restored is None:
        raise CheckpointError(f"no checkpoint in {path}")
    return restored
