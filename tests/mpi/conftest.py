"""Fixtures for the tests that run at any MPI size (`pytest --with-mpi tests/mpi` and under
`mpirun -n 2`)."""

import shutil
import tempfile

import pytest


@pytest.fixture
def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def shared_dir(comm):
    """One folder for every rank (they share this machine's filesystem, as a cluster's); removed
    after, once every rank is done with it."""
    path = tempfile.mkdtemp(prefix="jaxlaunch-mpi-") if comm.Get_rank() == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
