"""A long jitted loop of mpi4jax halo exchanges between two ranks, written without jaxlaunch in
mind, as mpi4jax's test suite runs its shallow-water example (issue 51, finding 10): a stencil on
each rank's grid, its edge sent to the other rank and received from it (one sends first, the
other receives first: mpi4jax.send and recv) and its periodic edge exchanged with itself
(mpi4jax.sendrecv), with mpi4jax's debug log on (MPI4JAX_DEBUG=1), as that suite leaves it. With
the log on, every MPI call that XLA's thread makes enters Python to print a line (nanobind's
gil_scoped_acquire: a thread state made and freed each time); the lines go to a file with no
buffer, as pytest's capture writes them.

`mpi4jax_loop.py --seconds S`: steps for about S seconds (rank 0 decides when both stop), then
each rank prints `done STEPS SUM`."""

import argparse
import contextlib
import io
import os
import tempfile
import time

os.environ["MPI4JAX_DEBUG"] = "1"  # mpi4jax's debug log, read when it is imported

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mpi4jax  # noqa: E402
from mpi4py import MPI  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=30.0)
parser.add_argument("--size", type=int, default=256, help="each rank's grid is SIZE x SIZE")
parser.add_argument("--inner", type=int, default=10, help="steps in one jitted call")
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
peer = (rank + 1) % comm.Get_size()


def exchange(edge):
    if rank % 2 == 0:
        mpi4jax.send(edge, dest=peer, comm=comm)
        return mpi4jax.recv(edge, source=peer, comm=comm)
    received = mpi4jax.recv(edge, source=peer, comm=comm)
    mpi4jax.send(edge, dest=peer, comm=comm)
    return received


@jax.jit
def steps(x):
    def step(_, x):
        x = x.at[-1].set(exchange(x[1]))
        x = x.at[:, 0].set(mpi4jax.sendrecv(x[:, -2], x[:, 0], source=rank, dest=rank, comm=comm))
        return 0.25 * (jnp.roll(x, 1, 0) + jnp.roll(x, -1, 0) + jnp.roll(x, 1, 1) + jnp.roll(x, -1, 1))

    return jax.lax.fori_loop(0, args.inner, step, x)


x = jnp.full((args.size, args.size), float(rank + 1), jnp.float32)
count = 0
with io.TextIOWrapper(tempfile.TemporaryFile(buffering=0), write_through=True) as log, \
        contextlib.redirect_stdout(log):
    x = steps(x).block_until_ready()  # compiled before the clock starts
    started = time.monotonic()
    while True:
        x = steps(x).block_until_ready()
        count += 1
        if comm.bcast(time.monotonic() - started >= args.seconds if rank == 0 else None, root=0):
            break
print(f"done {count} {float(x.sum()):.3f}", flush=True)
