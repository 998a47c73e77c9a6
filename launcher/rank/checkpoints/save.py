"""How a save is made (the save side of `Checkpoints`; `save()` and `wait()` themselves: manager.py).

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

Here: the host copies of this process's pieces (`_prepare`), the one background writer thread, the
commit protocol, the manifest, and pruning the older checkpoints once the new one is in place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import storage
from .agreement import RankAgreement
from .events import log_event
from .layout import LeafShards, Piece, describe_sharding, normalize, plan, relative, shards_of, whole
from .tree import flatten, is_jax_array

log = logging.getLogger("jaxlaunch.checkpoints")


@dataclass
class PendingSave:
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


class SaveWriter(RankAgreement):
    """The save side of `Checkpoints`: prepare a save, and write and commit it."""

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

    def _prepare(self, step: int, state, metadata, per_rank: bool) -> PendingSave:
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
        return PendingSave(step=step, final=self.directory / name, temp=self.directory / f".tmp-{name}",
                           metadata=metadata or {}, per_rank=per_rank, structure=structure, entries=entries,
                           pieces=pieces, arrays=_to_host(leaves, pieces))

    def _write_and_commit(self, job: PendingSave, background: bool) -> None:
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

    def _manifest(self, job: PendingSave, reports: list) -> dict:
        manifest = {"format": storage.FORMAT, "version": storage.VERSION, "step": job.step, "time": time.time(),
                    "metadata": job.metadata, "per_rank": job.per_rank, "processes": self.size}
        if job.per_rank:
            manifest["ranks"] = [_with_pieces(r["tree"], [r], rank) for rank, r in enumerate(reports)]
        else:
            manifest.update(_with_pieces({"structure": job.structure, "leaves": job.entries}, reports))
        return manifest

    def _after_commit(self, job: PendingSave, size: int) -> None:
        try:
            storage.prune(self.directory, self.keep)
        except OSError as exc:
            log.warning("checkpoint step %d saved, but older checkpoints were not pruned: %s", job.step, exc)
        seconds = time.perf_counter() - job.started
        log.info("checkpoint step %d saved: %.3f s in all, %.3f s blocking (%d bytes)",
                 job.step, seconds, job.blocked, size)
        log_event("checkpoint", step=job.step, seconds=round(seconds, 4), blocked=round(job.blocked, 4), bytes=size)


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

