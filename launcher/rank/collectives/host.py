"""The host path: the NumPy arrays and Python numbers of a tree that does not take the staged path
(staged.py) travel with mpi4py, one NumPy buffer per dtype, on a communicator of their own. Here:
that communicator, allreduce's host leaves, and the helpers that broadcast and allgather (ops.py)
use for theirs."""

from __future__ import annotations

import functools

import numpy as np
from mpi4py import MPI

from .leaves import MPI_OPS, call_groups, result_dtype, split, wire_dtype


@functools.cache
def host_comm():
    # Host leaves travel with mpi4py from this thread while mpi4jax calls run in XLA's threads;
    # two threads must never race collectives on one communicator. The first call is collective
    # (a Clone): make it inside the tracker's enter/leave, or a rank that never comes is not named.
    return MPI.COMM_WORLD.Clone()


def host_concat(parts):
    return np.concatenate([np.ravel(p) for p in parts]) if parts else np.empty(0)


def restore_host(value, original, kind):
    array = np.asarray(value)
    if kind == "python":
        return array.item()
    return array if isinstance(original, np.ndarray) else array[()]


def allreduce_host_leaves(leaves, kinds, indices, op, results):
    size = host_comm().Get_size()
    arrays = {i: np.asarray(leaves[i]) for i in indices}
    for group in call_groups([(arrays[i].shape, arrays[i].dtype) for i in indices], op):
        members = [indices[g] for g in group]
        wire = wire_dtype(arrays[members[0]].dtype, op)
        buffer = np.ascontiguousarray(host_concat([arrays[i].astype(wire, copy=False) for i in members]))
        host_comm().Allreduce(MPI.IN_PLACE, buffer, op=MPI_OPS[op])
        for i, value in zip(members, split(buffer, [arrays[i].shape for i in members])):
            value = value / size if op == "mean" else value.astype(result_dtype(arrays[i].dtype, op))
            results[i] = restore_host(value, leaves[i], kinds[i])
