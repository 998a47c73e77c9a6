"""Checkpoints for job authors: `ctx.checkpoints.save(step, state)` / `.restore(like=state)`.

Format 2 (one folder per step, readable with NumPy alone; see docs/design/preemption.md):

    RUN_DIR/checkpoints/step-00000042/
        manifest.json        step, time, metadata, the tree's structure, and per leaf: kind, dtype,
                             global shape, sharding, and its pieces: {file, offset, index}
        process-00000.data   the raw bytes of the pieces process 0 wrote, one after another
        process-00001.data   ...

A piece is a region of a leaf's global array (`index`: [start, stop] per axis). Every process
writes the pieces its devices own; replicated data is written once, spread over the processes
that hold it (layout.py). A restore reads, for each of its devices, only the pieces that overlap
what that device needs, so a checkpoint saved by N processes x D devices loads onto M x E with
the mesh of `like=` (restore.py).

Asynchronous: save() returns once the state is in host memory; the write happens in a background
thread and the next save, restore(), wait() or the end of main waits for it (save.py).

Atomic: everything is written into a hidden `.tmp-step-...` folder, each file fsynced, then the
folder is renamed into place (a rename is atomic), so a kill -9 at any moment leaves the previous
checkpoint whole. `restore()` only ever sees complete folders (storage.py).

  manager.py     Checkpoints: save, wait, restore, load, as a job calls them; the one pending save
  save.py        a save: this process's pieces copied off the devices, the background writer, the
                 commit protocol between the ranks, the manifest, pruning
  restore.py     a restore: the saved tree and its reader, each leaf onto like='s or the saved sharding
  agreement.py   the collectives between the ranks (tracked for the hang watchdog, or the writer's own)
  layout.py      which pieces each process writes; shardings described and rebuilt
  storage.py     the folder on disk: step folders, the atomic move, pruning, data files, reading pieces
  tree.py        the state's tree as JSON (plain trees), flattened into named leaves and back
  events.py      what a save or restore records in the run's events.jsonl
"""

from pathlib import Path

from .manager import Checkpoints
from .storage import CheckpointError, DamagedCheckpoint

__all__ = ["CheckpointError", "Checkpoints", "DamagedCheckpoint", "load_checkpoint"]


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
