"""`Checkpoints`: save (asynchronous by default), wait, restore, for every rank of a job.

A save copies this process's pieces off the devices in the caller's thread, on every rank at once,
then writes and commits them in a background thread (save.py says how). A restore tries the newest
complete checkpoint first and falls back past damaged ones, on every rank alike (restore.py reads
the leaves back). What the ranks do together: agreement.py.

Only one save is ever pending: the next save, restore(), wait() and the end of main wait for it,
and raise its error on every rank. A save after should_stop() said True is blocking.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from . import storage
from .events import log_event
from .restore import LeafRestorer
from .save import PendingSave, SaveWriter
from .storage import CheckpointError, DamagedCheckpoint
from .tree import flatten, unflatten

log = logging.getLogger("jaxlaunch.checkpoints")


class Checkpoints(SaveWriter, LeafRestorer):
    """The checkpoints of one run: `ctx.checkpoints` in a job (see the package doc)."""

    def __init__(self, directory, keep: int = 2, rank: int = 0, comm=None, devices=None, mesh=None,
                 asynchronous: bool = True):
        self.directory = Path(directory)
        self.keep, self.rank, self.comm = keep, rank, comm
        self.devices, self.mesh = devices, mesh
        self.asynchronous = asynchronous
        self._pending: PendingSave | None = None
        self._commit_comm = None
        self._queue = None

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
                    log_event("restored", step=value[0], folder=folder,
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


def _stopping() -> bool:
    """should_stop() said True: the job is about to end, so the save must be on disk first."""
    from ..preemption import NOTICE

    return NOTICE.agreed is not None

