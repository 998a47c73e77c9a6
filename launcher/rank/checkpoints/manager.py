"""`Checkpoints`: save (asynchronous by default), wait, restore, for every rank of a job.

A save has two halves:
1. In the caller's thread, on every rank at once: flatten the state, agree that it can be saved
   (one small allgather, so bad input raises at once on every rank), and copy this process's
   pieces off the devices. JAX arrays are immutable, so on the CPU a piece is a view of the
   array's own buffer (JAX then declines to donate that buffer for a step, it does not free it);
   on a GPU it is a device-to-host copy. NumPy arrays are copied (the job may change them).
2. In a background thread (or right there with blocking=True): rank 0 makes the hidden temp
   folder, every process writes its pieces into its own data file and fsyncs it, rank 0 writes
   the manifest and renames the folder into place, and the outcome is broadcast, so every rank
   learns the same verdict. These collectives run on a communicator of their own, polled with
   sleeps (never a busy wait that would take a core from training).

Only one save is ever pending: the next save, restore(), wait() and the end of main wait for it,
and raise its error on every rank. A save after should_stop() said True is blocking.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import storage
from .layout import LeafShards, Piece, describe_sharding, normalize, plan, relative, shards_of, whole
from .layout import sharding_from_description
from .storage import CheckpointError, DamagedCheckpoint, PieceReader
from .tree import flatten, is_jax_array, unflatten

log = logging.getLogger("jaxlaunch.checkpoints")


@dataclass
class _Save:
    """One save on its way to disk."""
    step: int
    final: Path
    temp: Path
    metadata: dict
    per_rank: bool
    structure: dict | None
    entries: list                     # the manifest's leaf entries (without pieces)
    pieces: list                      # this process's pieces ...
    arrays: list                      # ... and their values in host memory, until written
    started: float = 0.0
    blocked: float = 0.0
    outcome: str | None = None        # None once committed; else why not (the same on every rank)
    done: threading.Event = field(default_factory=threading.Event)


class Checkpoints:
    """The checkpoints of one run: `ctx.checkpoints` in a job (see the package doc)."""

    def __init__(self, directory, keep: int = 2, rank: int = 0, comm=None, devices=None, mesh=None,
                 asynchronous: bool = True):
        self.directory = Path(directory)
        self.keep, self.rank, self.comm = keep, rank, comm
        self.devices, self.mesh = devices, mesh
        self.asynchronous = asynchronous
        self._pending: _Save | None = None
        self._commit_comm = None
        self._queue = None

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.Get_size()

    # --- collectives in the caller's thread, counted for the hang watchdog --------------------

    def _collective(self, call, *args, **kwargs):
        """call(*args, **kwargs) as one tracked collective: every rank makes the same calls, so the
        sequence numbers the watchdog compares stay the same on every rank."""
        from ..tracker import TRACKER

        seq = TRACKER.start("checkpoint")
        TRACKER.enter(seq, "checkpoint")
        try:
            return call(*args, **kwargs)
        finally:
            TRACKER.leave()

    def _bcast(self, value):
        return value if self.size == 1 else self._collective(self.comm.bcast, value, root=0)

    def _everyones(self, value) -> list:
        return [value] if self.size == 1 else self._collective(self.comm.allgather, value)

    def _agree(self, error: str | None) -> str | None:
        """The first rank's error, on every rank; None when every rank is fine."""
        return next((e for e in self._everyones(error) if e), None)

    # --- collectives in the writer, on their own communicator -----------------------------

    def _quietly(self, background: bool) -> None:
        """In the background, wait for every rank with sleeps: MPI's blocking calls spin a core."""
        comm = self._commit_comm
        if background and hasattr(comm, "Ibarrier"):
            request, pause = comm.Ibarrier(), 0.0005
            while not request.Test():
                time.sleep(pause)
                pause = min(pause * 2, 0.02)

    def _commit_bcast(self, value, background: bool):
        if self.size == 1:
            return value
        self._quietly(background)
        return self._commit_comm.bcast(value, root=0)

    def _commit_gather(self, value, background: bool) -> list:
        if self.size == 1:
            return [value]
        self._quietly(background)
        return self._commit_comm.gather(value, root=0)

    # --- reading the folder ---

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, oldest first."""
        return storage.steps(self.directory)

    def latest_step(self) -> int | None:
        found = self.steps()
        return found[-1] if found else None

    @property
    def pending(self) -> bool:
        """True while a save is being written in the background."""
        return self._pending is not None and not self._pending.done.is_set()

    # --- save ---

    def save(self, step: int, state, metadata: dict | None = None, per_rank: bool = False,
             blocking: bool | None = None) -> Path:
        """Save `state` (any pytree of arrays and numbers) as checkpoint `step`; every rank calls it.
        Returns once the state is in host memory; the write goes on in the background (unless
        blocking, or this job was told to stop) and its outcome is raised by the next save,
        restore(), wait() or the end of main. The returned folder exists once it is committed."""
        self.wait()
        started = time.perf_counter()
        step = int(step)
        if blocking is None:
            blocking = not self.asynchronous or _stopping()
        if self.size > 1 and self._commit_comm is None:
            self._commit_comm = self.comm.Clone()  # collective, like every save
        job, error = None, None
        try:
            job = self._prepare(step, state, metadata, per_rank)
        except Exception as exc:  # noqa: BLE001  (agreed below: every rank raises it)
            error = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        error = self._agree(error)
        if error is not None:
            raise CheckpointError(f"checkpoint step {step} in {self.directory} not saved: {error}")
        job.started = started
        if blocking:
            self._write_and_commit(job, background=False)
            job.blocked = time.perf_counter() - started
            if job.outcome is not None:
                raise CheckpointError(f"checkpoint step {step} in {self.directory} not saved: {job.outcome}")
        else:
            self._pending = job
            self._writer().put(job)
            job.blocked = time.perf_counter() - started
        return job.final

    def _writer(self) -> "queue.SimpleQueue":
        """The background writer: one thread for the life of the job, fed one save at a time
        (starting a thread per save costs the caller a GIL hand-over, ~3 ms)."""
        if self._queue is None:
            import queue

            self._queue = queue.SimpleQueue()

            def write_forever(jobs):
                while True:
                    self._write_and_commit(jobs.get(), background=True)

            threading.Thread(target=write_forever, args=(self._queue,), name="jaxlaunch-checkpoint-writer",
                             daemon=True).start()
        return self._queue

    def wait(self) -> Path | None:
        """Wait for the pending save; raise its error (on every rank). The committed folder, or
        None when nothing was pending."""
        job, self._pending = self._pending, None
        if job is None:
            return None
        if self.size > 1:  # counted on every rank, finished or not, so the counts agree
            self._collective(job.done.wait)
        else:
            job.done.wait()
        if job.outcome is not None:
            raise CheckpointError(f"checkpoint step {job.step} in {self.directory} not saved: {job.outcome}")
        return job.final

    def _prepare(self, step: int, state, metadata, per_rank: bool) -> _Save:
        """Describe the state, plan the pieces and copy this process's ones off the devices."""
        try:
            json.dumps(metadata or {})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"checkpoint metadata must be JSON: {exc}") from None
        import jax

        devices = self.devices if self.devices is not None else jax.local_devices()
        paths, leaves, structure = flatten(state)
        entries = [_describe_leaf(leaf, path, devices) for path, leaf in zip(paths, leaves)]
        if per_rank:  # everything this process holds, written by itself
            pieces = [Piece(number, region, self.rank) for number, leaf in enumerate(leaves)
                      for region in _local_regions(leaf)]
        else:
            from ...rundir.results import dtype_from_name

            shards = [LeafShards(tuple(e["shape"]), dtype_from_name(e["dtype"]).itemsize, shards_of(leaf, self.size))
                      for e, leaf in zip(entries, leaves)]
            pieces = [p for p in plan(shards, self.size) if p.writer == self.rank]
        name = storage.step_name(step)
        return _Save(step=step, final=self.directory / name, temp=self.directory / f".tmp-{name}",
                     metadata=metadata or {}, per_rank=per_rank, structure=structure, entries=entries,
                     pieces=pieces, arrays=_to_host(leaves, pieces))

    def _write_and_commit(self, job: _Save, background: bool) -> None:
        """Both halves of the commit protocol (see the module doc). Every rank makes the same
        collective calls whatever fails, so a failure anywhere cannot leave a rank waiting."""
        error = None
        try:
            if self.rank == 0:
                try:
                    self.directory.mkdir(parents=True, exist_ok=True)
                    storage.clean_leftovers(self.directory)
                    job.temp.mkdir()
                except OSError as exc:
                    error = f"rank 0: cannot create {job.temp}: {exc}"
            error = self._commit_bcast(error, background)
            report = {"error": None, "pieces": [], "bytes": 0}
            if error is None and job.pieces:
                try:
                    placed = storage.write_data_file(job.temp / storage.data_file_name(self.rank), job.arrays)
                    report["pieces"] = [[p.leaf, [list(r) for r in p.region], offset]
                                        for p, (offset, _) in zip(job.pieces, placed)]
                    report["bytes"] = sum(n for _, n in placed)
                except Exception as exc:  # noqa: BLE001
                    report["error"] = f"rank {self.rank}: {type(exc).__name__}: {exc}"
            job.arrays = None  # the host copies go as soon as they are on disk
            if job.per_rank:
                report["tree"] = {"structure": job.structure, "leaves": job.entries}
            else:
                report["fingerprint"] = _fingerprint(job.entries)
            reports = self._commit_gather(report, background)
            size = 0
            if self.rank == 0:
                error = error or next((r["error"] for r in reports if r["error"]), None) or _differs(reports)
                size = sum(r["bytes"] for r in reports)
                if error is None:
                    try:
                        manifest = self._manifest(job, reports)
                        storage.write_file(job.temp / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
                        storage.fsync_dir(job.temp)
                        storage.move_into_place(self.directory, job.temp, job.final)
                    except Exception as exc:  # noqa: BLE001
                        error = f"rank 0: {type(exc).__name__}: {exc}"
                if error is not None:
                    shutil.rmtree(job.temp, ignore_errors=True)
            job.outcome = self._commit_bcast(error, background)
            if self.rank == 0 and job.outcome is None:
                self._after_commit(job, size)
        except BaseException as exc:  # noqa: BLE001  (a bug here must still reach the caller)
            job.outcome = job.outcome or f"rank {self.rank}: {type(exc).__name__}: {exc}"
        finally:
            job.done.set()

    def _manifest(self, job: _Save, reports: list) -> dict:
        manifest = {"format": storage.FORMAT, "version": storage.VERSION, "step": job.step, "time": time.time(),
                    "metadata": job.metadata, "per_rank": job.per_rank, "processes": self.size}
        if job.per_rank:
            manifest["ranks"] = [_with_pieces(r["tree"], [r], rank) for rank, r in enumerate(reports)]
        else:
            manifest.update(_with_pieces({"structure": job.structure, "leaves": job.entries}, reports))
        return manifest

    def _after_commit(self, job: _Save, size: int) -> None:
        try:
            storage.prune(self.directory, self.keep)
        except OSError as exc:
            log.warning("checkpoint step %d saved, but older checkpoints were not pruned: %s", job.step, exc)
        seconds = time.perf_counter() - job.started
        log.info("checkpoint step %d saved: %.3f s in all, %.3f s blocking (%d bytes)",
                 job.step, seconds, job.blocked, size)
        _log_event("checkpoint", step=job.step, seconds=round(seconds, 4), blocked=round(job.blocked, 4), bytes=size)

    # --- restore ---

    def restore(self, like=None):
        """(step, state) of the newest checkpoint that loads, or None when there is none. With
        `like` (e.g. the freshly initialised state), its structure and shardings are used: a
        checkpoint saved on any layout restores onto like's. A damaged checkpoint (missing or
        cut-short files) is skipped for the previous one, on every rank alike."""
        self.wait()
        started = time.perf_counter()
        folders = None
        if self.rank == 0 or self.size == 1:
            folders = [str(f) for f in storage.candidates(self.directory)] if self.directory.exists() else []
        folders = self._bcast(folders)
        skipped = []
        for folder in folders:
            value, problem = None, None
            try:
                value = self.load(folder, like=like)
            except DamagedCheckpoint as exc:
                problem = (f"rank {self.rank}: {exc}", True)
            except Exception as exc:  # noqa: BLE001
                problem = (f"rank {self.rank}: {exc}", False)
            problems = [p for p in self._everyones(problem) if p]
            if not problems:
                if self.rank == 0:
                    _log_event("restored", step=value[0], folder=folder,
                               seconds=round(time.perf_counter() - started, 3))
                    log.info("restored checkpoint step %d from %s", value[0], folder)
                return value
            if not all(damaged for _, damaged in problems):
                raise CheckpointError(f"cannot restore {folder}: "
                                      f"{next(text for text, damaged in problems if not damaged)}")
            log.warning("skipping checkpoint %s: %s", folder, problems[0][0])
            skipped.append(problems[0][0])
        if skipped:
            raise CheckpointError(f"no checkpoint in {self.directory} can be read; the newest: {skipped[0]}")
        return None

    def load(self, folder, like=None):
        """(step, state) from one checkpoint folder, on this process alone (no collective)."""
        import jax

        folder = Path(folder)
        manifest = storage.read_manifest(folder)
        tree, reader = self._tree_and_reader(folder, manifest)
        entries = tree["leaves"]
        devices = self.devices if self.devices is not None else jax.local_devices()
        if like is not None:
            paths, like_leaves, _ = flatten(like)
            saved = [e["path"] for e in entries]
            if paths != saved:
                first = next((f"{a!r} vs saved {b!r}" for a, b in zip(paths, saved) if a != b),
                             f"{len(paths)} leaves vs {len(saved)} saved")
                raise CheckpointError(f"{folder}: the tree passed as like= does not match the checkpoint: {first}")
            leaves = [self._restore_leaf(reader, e, devices, leaf) for e, leaf in zip(entries, like_leaves)]
            return manifest["step"], jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)
        if tree["structure"] is None:
            raise CheckpointError(f"{folder}: the saved tree has node types JSON cannot describe (a namedtuple, a "
                                  f"custom pytree); pass restore(like=initial_state) to rebuild it")
        leaves = [self._restore_leaf(reader, e, devices) for e in entries]
        return manifest["step"], unflatten(tree["structure"], leaves)

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


# --- helpers ---------------------------------------------------------------------------------

def _describe_leaf(value, path: str, devices) -> dict:
    import numpy as np

    if isinstance(value, bool) or isinstance(value, (int, float)) and not isinstance(value, np.generic):
        entry, dtype, shape = {"kind": "python", "python_type": type(value).__name__}, np.asarray(value).dtype, ()
    elif isinstance(value, np.generic):
        entry, dtype, shape = {"kind": "numpy_scalar"}, value.dtype, ()
    elif isinstance(value, np.ndarray):
        entry, dtype, shape = {"kind": "numpy"}, value.dtype, value.shape
    else:  # a jax.Array
        entry, dtype, shape = {"kind": "jax", "sharding": describe_sharding(value, devices)}, value.dtype, value.shape
    if dtype.hasobject:
        raise ValueError(f"checkpoint leaf {path}: an array of Python objects; checkpoints hold numbers only")
    entry.update(path=path, dtype=dtype.name, shape=list(shape))
    return entry


def _local_regions(value) -> list:
    """The distinct regions of a leaf that this process's devices hold."""
    if not is_jax_array(value):
        return [whole(getattr(value, "shape", ()))]
    shape = tuple(value.shape)
    return sorted({normalize(shard.index, shape) for shard in value.addressable_shards})


def _to_host(leaves: list, pieces: list[Piece]) -> list:
    """This process's pieces in host memory: device-to-host copies started together, then taken."""
    import numpy as np

    sources = []
    for piece in pieces:
        value = leaves[piece.leaf]
        if is_jax_array(value):
            shape = tuple(value.shape)
            for shard in value.addressable_shards:
                held = normalize(shard.index, shape)
                if all(h0 <= p0 and p1 <= h1 for (p0, p1), (h0, h1) in zip(piece.region, held)):
                    break
            else:
                raise ValueError(f"no device of process {piece.writer} holds {piece.region} of an array")
            data, part = shard.data, None
            if shard.device.platform == "cpu":
                if piece.region != held:
                    part = relative(piece.region, held)          # a view of the buffer
            else:
                if piece.region != held:
                    data = data[relative(piece.region, held)]    # copy only this part off the device
                # Into a host array of our own: np.asarray(data) would keep a cached host copy on
                # the job's array for as long as the job keeps the array, after the save is done.
                data = _onto_host_device(data)
            sources.append((data, part))
        elif isinstance(value, np.ndarray):
            sources.append((np.array(value[relative(piece.region, whole(value.shape))]), None))
        else:
            sources.append((np.asarray(value), None))
    arrays = []
    for data, part in sources:
        host = np.asarray(data)
        arrays.append(host[part] if part is not None else host)
    return arrays


def _onto_host_device(data):
    """A copy of a device array on the host (CPU) device, started asynchronously; np.asarray of
    it is then a view. Falls back to the array itself where no CPU device is available."""
    import jax

    try:
        return jax.device_put(data, jax.devices("cpu")[0])
    except RuntimeError:
        return data


def _fingerprint(entries: list) -> str:
    described = json.dumps([[e["path"], e["dtype"], e["shape"]] for e in entries])
    return hashlib.sha1(described.encode()).hexdigest()


def _differs(reports: list) -> str | None:
    for rank, report in enumerate(reports):
        if report.get("fingerprint") != reports[0].get("fingerprint"):
            return (f"rank {rank}'s state has other leaves, shapes or dtypes than rank 0's; state that differs "
                    f"between processes needs save(..., per_rank=True)")
    return None


def _with_pieces(tree: dict, reports: list, first_rank: int = 0) -> dict:
    """The tree's leaf entries with the pieces each rank reported, in index order."""
    leaves = [dict(entry, pieces=[]) for entry in tree["leaves"]]
    for rank, report in enumerate(reports, start=first_rank):
        for leaf, index, offset in report["pieces"]:
            leaves[leaf]["pieces"].append({"file": storage.data_file_name(rank), "offset": offset, "index": index})
    for leaf in leaves:
        leaf["pieces"].sort(key=lambda piece: piece["index"])
    return {"structure": tree["structure"], "leaves": leaves}


def _stopping() -> bool:
    """should_stop() said True: the job is about to end, so the save must be on disk first."""
    from ..preemption import NOTICE

    return NOTICE.agreed is not None


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


def _log_event(event: str, **fields) -> None:
    from ...environment import RUN_DIR_ENV

    if os.environ.get(RUN_DIR_ENV):
        from ...rundir import RunDirectory

        RunDirectory(os.environ[RUN_DIR_ENV]).log_event(event, **fields)
