"""ctx.checkpoints across real MPI ranks: replicated state written once and spread over the ranks,
one data file per rank, per_rank=True, an error on any rank (bad input, a background write, a
restore) raised on every rank, the same step saved twice (as jobs/examples/train_data_parallel.py does) and
a save stopped between its two renames. Written for any MPI size: run as
`pytest --with-mpi tests/mpi` and `mpirun -n 2 python -m pytest --with-mpi tests/mpi`.
Each rank gathers its outcome before asserting, so a failing rank does not leave the others hanging."""

import errno
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher.rank.checkpoints import CheckpointError, Checkpoints, storage

pytestmark = pytest.mark.mpi


def outcome_of(call):
    """What call() returned, or the CheckpointError it raised (as text)."""
    try:
        return call()
    except CheckpointError as exc:
        return f"CheckpointError: {exc}"


def test_a_replicated_save_is_spread_over_every_rank_and_restored_everywhere(comm, shared_dir):
    rank, size = comm.Get_rank(), comm.Get_size()
    state = {"big": np.arange(1 << 19, dtype=np.float32), "n": 7}  # the same in every process
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(1, state)
    assert comm.allgather(checkpoints.wait()) == [checkpoints.directory / "step-00000001"] * size
    step, restored = checkpoints.restore()
    assert step == 1 and np.array_equal(restored["big"], state["big"]) and restored["n"] == 7
    folder = checkpoints.directory / "step-00000001"
    manifest = json.loads((folder / "manifest.json").read_text())
    big = next(leaf for leaf in manifest["leaves"] if leaf["path"] == "['big']")
    assert sorted(piece["file"] for piece in big["pieces"]) == [storage.data_file_name(r) for r in range(size)]


def test_per_rank_state_gives_each_rank_its_own(comm, shared_dir):
    rank = comm.Get_rank()
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(2, {"x": np.full(2 + rank, float(rank))}, per_rank=True)
    step, restored = checkpoints.restore()
    comm.barrier()
    assert step == 2 and np.array_equal(restored["x"], np.full(2 + rank, float(rank)))


def test_bad_input_on_the_last_rank_raises_at_save_on_every_rank_and_saves_nothing(comm, shared_dir):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(1, {"x": np.zeros(1)}, per_rank=True)
    checkpoints.wait()
    state = {"x": np.array([object()]) if rank == last else np.zeros(1)}
    outcomes = comm.allgather(outcome_of(lambda: checkpoints.save(2, state, per_rank=True)))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "checkpoint step 2" in outcome, outcome
        assert f"not saved: rank {last}: ValueError" in outcome, outcome
    assert checkpoints.steps() == [1]
    assert sorted(p.name for p in checkpoints.directory.iterdir()) == ["step-00000001"]  # no temp folder left


def test_a_background_write_failing_on_the_last_rank_raises_on_every_rank(comm, shared_dir, monkeypatch):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    write = storage.write_data_file

    def failing_on_the_last_rank(path, arrays):
        if rank == last:
            raise OSError(errno.ENOSPC, "injected: no space left on device", str(path))
        return write(path, arrays)

    monkeypatch.setattr(storage, "write_data_file", failing_on_the_last_rank)
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(1, {"big": np.ones(1 << 19, np.float32)})  # returns; the write fails behind it
    outcomes = comm.allgather(outcome_of(checkpoints.wait))
    assert len(set(outcomes)) == 1, outcomes  # the same verdict everywhere
    assert f"not saved: rank {last}: OSError" in outcomes[0] and "no space left" in outcomes[0]
    comm.barrier()
    assert list(checkpoints.directory.iterdir()) == []


def test_a_restore_that_fails_on_the_last_rank_raises_on_every_rank(comm, shared_dir):
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(4, {"mine": np.full(2, rank)}, per_rank=True)
    checkpoints.wait()
    like = {"mine": np.zeros(2), "extra": 0} if rank == last else None  # a like= that does not fit
    outcomes = comm.allgather(outcome_of(lambda: checkpoints.restore(like=like)))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "cannot restore" in outcome, outcome
        assert f"rank {last}:" in outcome and "like= does not match" in outcome, outcome


def test_the_same_step_saved_twice_then_restored_like_the_initial_state(comm, shared_dir):
    """jobs/examples/train_data_parallel.py: a periodic save of step 5, then the should_stop save of step 5."""
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
    checkpoints.wait()
    with monkeypatch.context() as patch:
        rename = os.rename

        def rename_or_fail(src, dst):  # only rank 0 renames, in its writer thread
            if os.path.basename(src).startswith(".tmp-"):
                raise OSError(errno.EIO, "injected: the disk went away", str(src))
            rename(src, dst)

        patch.setattr(os, "rename", rename_or_fail)
        checkpoints.save(3, {"x": np.full(2, 33.0)})
        outcomes = comm.allgather(outcome_of(checkpoints.wait))
    for outcome in outcomes:
        assert isinstance(outcome, str) and "not saved: rank 0: OSError" in outcome, outcome
    step, state = Checkpoints(shared_dir, rank=rank, comm=comm).restore()  # the old copy, on every rank
    assert step == 3 and np.array_equal(state["x"], np.full(2, 3.0))
    checkpoints.save(3, {"x": np.full(2, 33.0)})
    checkpoints.save(4, {"x": np.full(2, 4.0)})
    step, state = checkpoints.restore()
    assert step == 4 and sorted(p.name for p in checkpoints.directory.iterdir()) == ["step-00000003", "step-00000004"]


def test_wait_counts_as_one_collective_on_every_rank_finished_or_not(comm, shared_dir):
    """The watchdog compares collective counts across ranks; a wait counted only where the write
    was still going on would make them differ by a race."""
    import time

    from launcher.rank.tracker import TRACKER

    checkpoints = Checkpoints(shared_dir, rank=comm.Get_rank(), comm=comm)
    checkpoints.save(1, {"x": np.zeros(3)})
    deadline = time.monotonic() + 120  # the finished case: the write is done here ...
    while checkpoints.pending:
        assert time.monotonic() < deadline, "the background write did not finish in 120 s"
        time.sleep(0.01)
    comm.barrier()  # ... and on every rank (a plain MPI barrier: not a collective the tracker counts)
    before = TRACKER.count
    checkpoints.wait()
    counted = 1 if comm.Get_size() > 1 else 0  # one process: no collective, nothing to count
    assert comm.allgather(TRACKER.count - before) == [counted] * comm.Get_size()
