"""ctx.checkpoints across ranks: who writes, one file per rank with per_rank=True, an error on any
rank (save or restore) raises on every rank, the same step saved twice (as jobs/train_data_parallel.py
does) and a save stopped between its two renames. Written for any MPI size: run as
`pytest --with-mpi tests/mpi` and `mpirun -n 2 python -m pytest --with-mpi tests/mpi`.
Each rank gathers its outcome before asserting, so a failing rank does not leave the others hanging."""

import errno
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher.runtime.checkpoints import CheckpointError, Checkpoints

pytestmark = pytest.mark.mpi


def outcome_of(call):
    """What call() returned, or the CheckpointError it raised (as text)."""
    try:
        return call()
    except CheckpointError as exc:
        return f"CheckpointError: {exc}"


def test_a_replicated_save_calls_the_writer_on_rank_0_only(comm, shared_dir, monkeypatch):
    rank = comm.Get_rank()
    writes = []
    write_arrays = Checkpoints._write_arrays

    def recording(self, folder, state, per_rank):
        writes.append(per_rank)
        return write_arrays(self, folder, state, per_rank)

    monkeypatch.setattr(Checkpoints, "_write_arrays", recording)
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(1, {"x": np.full(2, float(rank))})  # replicated: rank 0's copy is the one kept
    checkpoints.save(2, {"x": np.full(2, float(rank))}, per_rank=True)
    restored = checkpoints.restore()
    assert comm.allgather(writes) == [[False, True]] + [[True]] * (comm.Get_size() - 1)
    assert restored[0] == 2 and np.array_equal(restored[1]["x"], np.full(2, float(rank)))
    folder = checkpoints.directory / "step-00000001"
    _, replicated = checkpoints.load(folder)
    assert np.array_equal(replicated["x"], np.zeros(2))  # on every rank
    assert sorted(p.name for p in folder.iterdir()) == ["arrays.npz", "manifest.json"]


def test_a_failed_per_rank_write_on_the_last_rank_raises_on_every_rank_and_saves_nothing(comm, shared_dir):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(1, {"x": np.zeros(1)}, per_rank=True)
    state = {"x": np.array([object()]) if rank == last else np.zeros(1)}
    outcomes = comm.allgather(outcome_of(lambda: checkpoints.save(2, state, per_rank=True)))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "checkpoint step 2" in outcome, outcome
        assert f"not saved: rank {last}: ValueError" in outcome, outcome
    assert checkpoints.steps() == [1]
    assert sorted(p.name for p in checkpoints.directory.iterdir()) == ["step-00000001"]  # no temp folder left


def test_a_restore_that_fails_on_the_last_rank_raises_on_every_rank(comm, shared_dir):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(4, {"mine": np.full(2, rank)}, per_rank=True)
    comm.barrier()
    if rank == 0:
        (checkpoints.directory / "step-00000004" / f"arrays-rank-{last}.npz").write_bytes(b"not an npz")
    comm.barrier()
    outcomes = comm.allgather(outcome_of(checkpoints.restore))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "cannot restore" in outcome, outcome
        assert f"rank {last}:" in outcome and f"arrays-rank-{last}.npz" in outcome, outcome


def test_the_same_step_saved_twice_then_restored_like_the_initial_state(comm, shared_dir):
    """jobs/train_data_parallel.py: a periodic save of step 5, then the should_stop save of step 5."""
    rank = comm.Get_rank()
    stack = jax.pmap(lambda a: a)
    n = jax.local_device_count()
    like = {"params": stack(jnp.zeros((n, 3))), "losses": np.zeros(0)}
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm, keep=2)
    # saved from one device, not like's pmap layout: like's sharding must win
    checkpoints.save(5, {"params": jnp.ones((n, 3)), "losses": np.array([1.0])})
    checkpoints.save(5, {"params": jnp.full((n, 3), 2.0), "losses": np.array([1.0, 0.5])})
    step, state = checkpoints.restore(like=like)
    comm.barrier()
    assert step == 5 and np.array_equal(state["losses"], [1.0, 0.5])
    assert isinstance(state["params"], jax.Array) and state["params"].sharding == like["params"].sharding
    assert np.array_equal(np.asarray(state["params"]), np.full((n, 3), 2.0))
    assert sorted(p.name for p in checkpoints.directory.iterdir()) == ["step-00000005"]


def test_a_save_stopped_between_its_two_renames_raises_everywhere_and_keeps_the_old_step(comm, shared_dir,
                                                                                        monkeypatch):
    rank = comm.Get_rank()
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(3, {"x": np.full(2, 3.0)})
    with monkeypatch.context() as patch:
        rename = os.rename

        def rename_or_fail(src, dst):  # only rank 0 renames
            if os.path.basename(src).startswith(".tmp-"):
                raise OSError(errno.EIO, "injected: the disk went away", str(src))
            rename(src, dst)

        patch.setattr(os, "rename", rename_or_fail)
        outcomes = comm.allgather(outcome_of(lambda: checkpoints.save(3, {"x": np.full(2, 33.0)})))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "not saved: rank 0: OSError" in outcome, outcome
    step, state = Checkpoints(shared_dir, rank=rank, comm=comm).restore()  # the old copy, on every rank
    assert step == 3 and np.array_equal(state["x"], np.full(2, 3.0))
    checkpoints.save(3, {"x": np.full(2, 33.0)})
    checkpoints.save(4, {"x": np.full(2, 4.0)})
    step, state = checkpoints.restore()
    assert step == 4 and sorted(p.name for p in checkpoints.directory.iterdir()) == ["step-00000003", "step-00000004"]
