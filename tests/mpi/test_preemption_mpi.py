"""should_stop() and checkpoints across ranks. Written for any MPI size: run as
`pytest --with-mpi tests/mpi` and `mpirun -n 2 python -m pytest --with-mpi tests/mpi`."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher.rank import preemption
from launcher.rank.checkpoints import CheckpointError, Checkpoints

pytestmark = pytest.mark.mpi


@pytest.fixture
def fresh_notice(monkeypatch):
    notice = preemption.StopNotice()
    monkeypatch.setattr(preemption, "NOTICE", notice)
    return notice


def test_a_notice_on_the_last_rank_only_stops_every_rank_at_the_same_call(comm, fresh_notice):
    answers = []
    for call in range(5):
        if call == 2 and comm.Get_rank() == comm.Get_size() - 1:
            fresh_notice.set("SIGUSR2")
        answers.append(preemption.should_stop())
    assert answers == [False, False, True, True, True]
    assert fresh_notice.agreed["call"] == 3 and fresh_notice.agreed["sources"] == ["SIGUSR2"]
    assert comm.allgather(fresh_notice.agreed["call"]) == [3] * comm.Get_size()


def test_replicated_save_is_written_once_and_restored_everywhere(comm, shared_dir):
    rank = comm.Get_rank()
    state = {"w": jax.pmap(lambda x: x)(jnp.ones((jax.local_device_count(), 3))), "step_losses": np.arange(4.0),
             "count": 7}
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(10, state, metadata={"lr": 0.1})
    checkpoints.wait()
    folder = checkpoints.directory / "step-00000010"
    names = sorted(p.name for p in folder.iterdir())
    assert names[0] == "manifest.json" and names[1:] and all(n.startswith("process-") for n in names[1:])
    step, restored = checkpoints.restore()
    assert step == 10 and restored["count"] == 7 and type(restored["count"]) is int
    assert np.array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))
    assert restored["w"].sharding == state["w"].sharding


def test_per_rank_save_gives_each_rank_its_own_state(comm, shared_dir):
    rank = comm.Get_rank()
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    checkpoints.save(3, {"mine": np.full(2, rank)}, per_rank=True)
    step, restored = checkpoints.restore()
    assert step == 3 and np.array_equal(restored["mine"], np.full(2, rank))
    names = sorted(p.name for p in (checkpoints.directory / "step-00000003").iterdir())
    assert names == sorted(["manifest.json", *(f"process-{r:05d}.data" for r in range(comm.Get_size()))])


def test_a_failed_write_on_rank_0_raises_on_every_rank(comm, shared_dir):
    rank = comm.Get_rank()
    checkpoints = Checkpoints(shared_dir, rank=rank, comm=comm)
    # A value rank 0 cannot store (an object array): the other ranks must not hang or succeed.
    state = {"x": np.array([object()]) if rank == 0 else np.zeros(1)}
    with pytest.raises(CheckpointError, match="checkpoint step 1 .* not saved: rank 0"):
        checkpoints.save(1, state)
    assert checkpoints.steps() == []
