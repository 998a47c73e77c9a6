"""Cross-process collectives over pytrees, for job authors: allreduce, broadcast, allgather, barrier
and TreePacker, reached as `launcher.allreduce` & co. (this file re-exports them). They run inside
each rank; ops.py's doc says how a leaf is read and how they must be called.

  ops.py        the public operations (allreduce, broadcast, allgather, barrier, wait_pending): each
                picks the path for its tree and tells the watchdog's tracker where it is
  leaves.py     how a leaf is read and travels: its kind, wire and result dtypes, the leaves that
                share one MPI call, the home device (the first local one)
  staged.py     the staged path: the common tree on a CPU through host memory and mpi4py, planned
                once per signature; with transport.py, the only place that uses JAX internals
  device.py     the device path: per-device rows, other placements, GPUs, in one fused jit per
                call (and the fused mpi4jax calls of broadcast and allgather)
  host.py       the host path: NumPy arrays and Python numbers of a tree that goes the device way
  packer.py     TreePacker: a gradient tree packed into one buffer inside the job's own jit
  transport.py  the device path's MPI step: mpi4jax's FFI allreduce without its ordered effect
  traced.py     the same operations inside the job's own jit (one device per process)
  xla.py        the device leaves over XLA's own collectives instead (spec `transport: xla`)
  choice.py     which of the two transports a call uses (the spec's, or `using(...)` for a block)

Imports flow one way (ops -> staged -> host -> leaves; ops -> device -> leaves, transport, xla, choice);
nothing here imports this file. What one module here takes from another has a public name (no
underscore; tests/unit/test_layout.py checks), yet is no API for jobs: they use what this file exports.
"""

from .ops import allgather, allreduce, barrier, broadcast, wait_pending  # wait_pending: bootstrap's, before exit
from .packer import TreePacker

__all__ = ["allreduce", "broadcast", "allgather", "barrier", "TreePacker"]
