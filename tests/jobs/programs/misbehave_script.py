"""A script that misbehaves on one rank, for the supervision tests: `--mode MODE --rank R`.
  raise       rank R raises ValueError in a function of this file
  exit        rank R calls sys.exit(CODE)
  exit-early  rank R sys.exit(0)s while the others enter launcher.allreduce (a launcher collective)
  hang        rank R sleeps forever while the others wait in an MPI barrier of the script's own
Every other rank does a little work and ends normally."""

import argparse
import sys
import time

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--mode", required=True, choices=["raise", "exit", "exit-early", "hang", "ok"])
parser.add_argument("--rank", type=int, default=1)
parser.add_argument("--code", type=int, default=3)
args = parser.parse_args()
comm = MPI.COMM_WORLD
me = comm.Get_rank()


def load_batch(index):
    if me == args.rank and args.mode == "raise":
        raise ValueError(f"corrupt batch {index} on rank {me}")
    return index


if args.mode == "exit" and me == args.rank:
    sys.exit(args.code)
if args.mode == "exit-early":
    import jax.numpy as jnp

    import launcher

    if me == args.rank:
        sys.exit(0)
    launcher.allreduce(jnp.ones(2))
if args.mode == "hang":
    if me == args.rank:
        while True:  # stuck in its own loop: alive, never reaching the barrier
            time.sleep(0.5)
    comm.Barrier()
for i in range(3):
    load_batch(i)
print(f"rank {me} done")
