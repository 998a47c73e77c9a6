"""An mpi4jax program as people write them for `mpirun -n N python mpi4jax_solver.py`: it reads
MPI.COMM_WORLD at import, parses its own argv, and ends with sys.exit(0) on every rank. jaxlaunch
runs it unchanged (mpi4jax_solver.yaml, or `jaxlaunch run mpi4jax_solver.py -n 2 -- --size 64`).

Jacobi iterations for -u'' = 1 on [0, 1] with u(0) = u(1) = 0, the grid split across the ranks;
each iteration exchanges halo cells with the neighbours (mpi4jax.sendrecv) and the residual is
summed over every rank (mpi4jax.allreduce)."""

import argparse
import json
import os
import sys

from mpi4py import MPI

import jax
import jax.numpy as jnp
import mpi4jax

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--size", type=int, default=64, help="grid points per rank")
parser.add_argument("--iterations", type=int, default=50)
parser.add_argument("--out", default=None, help="rank 0 writes the result here (JSON)")
args = parser.parse_args()

h = 1.0 / (args.size * size + 1)
u = jnp.zeros(args.size, dtype=jnp.float32)


@jax.jit
def sweep(u, left, right):
    padded = jnp.concatenate([left[None], u, right[None]])
    new = 0.5 * (padded[:-2] + padded[2:] + h * h)
    return new, jnp.sum((new - u) ** 2)


zero = jnp.zeros((), dtype=jnp.float32)
for _ in range(args.iterations):
    # halo exchange: my first cell goes left, my last goes right (MPI.PROC_NULL at the ends)
    left_peer = rank - 1 if rank > 0 else MPI.PROC_NULL
    right_peer = rank + 1 if rank < size - 1 else MPI.PROC_NULL
    from_left = mpi4jax.sendrecv(u[0], zero, source=left_peer, dest=left_peer, comm=comm)
    from_right = mpi4jax.sendrecv(u[-1], zero, source=right_peer, dest=right_peer, comm=comm)
    u, change = sweep(u, from_left if rank > 0 else zero, from_right if rank < size - 1 else zero)
    residual = mpi4jax.allreduce(change, op=MPI.SUM, comm=comm)

total = mpi4jax.allreduce(jnp.sum(u) * h, op=MPI.SUM, comm=comm)
print(f"rank {rank} of {size}: integral of u = {float(total):.6f}, last change {float(residual):.3e}")
if rank == 0 and args.out:
    with open(args.out + ".tmp", "w") as f:
        json.dump({"ranks": size, "integral": float(total), "residual": float(residual)}, f)
    os.replace(args.out + ".tmp", args.out)
sys.exit(0)
