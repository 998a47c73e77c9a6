"""The public operations: allreduce, broadcast, allgather, barrier (and wait_pending). Each picks
its path for the tree it is given (staged.py when every leaf can be staged through host memory,
otherwise device.py and host.py) and tells the watchdog's tracker when its collective starts, is
dispatched, waits in MPI and ends.

How a leaf is read:
- A jax.Array laid out one row per local device (pmap output, or shape (devices, ...) sharded
  over ctx.mesh along its first axis) holds one contribution per device: allreduce reduces over
  the devices of all hosts and returns the same shape and sharding, every row holding the total,
  like `lax.psum` inside pmap.
- Anything else (numpy array, Python number, an array on one device, replicated, or sharded in
  any other way, such as a model-parallel weight) is this process's contribution: allreduce
  reduces over processes and returns the same kind of value, with the same sharding.

Inside the job's own `jax.jit` on a process with one device, allreduce, broadcast and allgather
become part of the jitted computation (traced.py), with the same rules. Inside pmap, shard_map or a
jit spanning several devices they refuse: reduce the local devices with `jax.lax.psum` there.
Every process must call them in the same order with the same tree structure, shapes, dtypes and
placements. They are not thread-safe: call them from one thread.
"""

from __future__ import annotations

import jax
import numpy as np
from mpi4py import MPI

from ..tracker import TRACKER
from .device import DEPENDENCY, allreduce_device_leaves, fused_allgather, fused_bcast
from .host import allreduce_host_leaves, host_comm, host_concat, restore_host
from . import choice, traced, xla
from .leaves import (DEVICE_KINDS, HOST_KINDS, MPI_OPS, by_wire_dtype, classify, dtype_of, home_device, split,
                     split_columns)
from .staged import (ArrayImpl, allreduce_one_array, allreduce_plan, allreduce_staged, broadcast_one_array,
                     broadcast_plan, broadcast_staged, staged_signature)


def _check_op(op):
    if op not in MPI_OPS:
        raise ValueError(f"op={op!r} is not supported; use one of {', '.join(MPI_OPS)}")


def allreduce(tree, op: str = "sum"):
    """Reduce every leaf over all devices of all processes (see the module doc for leaf kinds).

    op: "sum", "mean", "max" or "min". Returns a tree of the same structure, each leaf of its
    input's kind and placement. A sum of bools counts; max/min of bools are any/all.
    """
    _check_op(op)
    over_mpi = choice.current() == "mpi4jax"  # else XLA's collectives (xla.py) for the device leaves
    if over_mpi and type(tree) is ArrayImpl:
        result = allreduce_one_array(tree, op)
        if result is not None:
            return result
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    if traced.is_traced(leaves):
        return traced.allreduce(leaves, treedef, op)
    signature = staged_signature(leaves) if over_mpi else None
    if signature is not None:
        return treedef.unflatten(allreduce_staged(leaves, allreduce_plan(signature, op), op))
    home = home_device()
    kinds = [classify(v, tree, i, home) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    on_device = [i for i, k in enumerate(kinds) if k in DEVICE_KINDS]
    on_host = [i for i, k in enumerate(kinds) if k in HOST_KINDS]
    seq = TRACKER.start("allreduce")
    if on_device:
        TRACKER.dispatched(seq, "allreduce", allreduce_device_leaves(leaves, kinds, on_device, op, results))
    if on_host:
        TRACKER.enter(seq, "allreduce")
        allreduce_host_leaves(leaves, kinds, on_host, op, results)
        TRACKER.leave()
    return jax.tree_util.tree_unflatten(treedef, results)


def broadcast(tree, root: int = 0):
    """Every process gets the root process's tree (same structure, shapes and dtypes required)."""
    over_mpi = choice.current() == "mpi4jax"
    if over_mpi and type(tree) is ArrayImpl:
        result = broadcast_one_array(tree, root)
        if result is not None:
            return result
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if traced.is_traced(leaves):
        return traced.broadcast(leaves, treedef, root)
    signature = staged_signature(leaves) if leaves and over_mpi else None
    if signature is not None:
        return treedef.unflatten(broadcast_staged(leaves, broadcast_plan(signature), root))
    kinds = [classify(v, tree, i) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    device = [i for i, k in enumerate(kinds) if k in DEVICE_KINDS]
    host = [i for i, k in enumerate(kinds) if k in HOST_KINDS]
    home = home_device()
    seq = TRACKER.start("broadcast")
    for wire, indices in by_wire_dtype(leaves, device):
        parts = [jax.device_put(leaves[i], home).astype(wire) for i in indices]
        reduced = fused_bcast(parts, root=root) if over_mpi else xla.broadcast(parts, root)
        TRACKER.dispatched(seq, "broadcast", reduced[-1])
        for i, value in zip(indices, reduced):
            results[i] = jax.device_put(value.astype(leaves[i].dtype), leaves[i].sharding)
    for wire, indices in by_wire_dtype(leaves, host):
        buffer = np.ascontiguousarray(host_concat([np.asarray(leaves[i], wire) for i in indices]))
        TRACKER.enter(seq, "broadcast")
        host_comm().Bcast(buffer, root=root)
        TRACKER.leave()
        for i, value in zip(indices, split(buffer, [np.shape(leaves[i]) for i in indices])):
            results[i] = restore_host(value.astype(dtype_of(leaves[i])), leaves[i], kinds[i])
    TRACKER.done(seq)  # an empty tree sends nothing, and must not stay pending
    return jax.tree_util.tree_unflatten(treedef, results)


def allgather(tree):
    """Concatenate every leaf over processes along its leading axis, in rank order.

    A leaf of shape (n, ...) becomes (size * n, ...); a scalar becomes shape (size,). Stacked
    leaves keep their per-device rows, so the result is in global device order. Results are
    numpy arrays for numpy/Python inputs, and arrays on the first local device for jax inputs.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if traced.is_traced(leaves):
        return traced.allgather(leaves, treedef)
    kinds = [classify(v, tree, i) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    home = home_device()
    seq = TRACKER.start("allgather")
    for on_device, wanted in ((True, DEVICE_KINDS), (False, HOST_KINDS)):
        indices = [i for i, k in enumerate(kinds) if k in wanted]
        for wire, members in by_wire_dtype(leaves, indices):
            if on_device:
                parts = [jax.device_put(leaves[i], home).astype(wire) for i in members]
                gathered = fused_allgather(parts) if choice.current() == "mpi4jax" else xla.allgather(parts)
                TRACKER.dispatched(seq, "allgather", gathered[-1])
            else:
                buffer = np.ascontiguousarray(host_concat([np.asarray(leaves[i], wire) for i in members]))
                out = np.empty((MPI.COMM_WORLD.Get_size(), buffer.size), buffer.dtype)
                TRACKER.enter(seq, "allgather")
                host_comm().Allgather(buffer, out)
                TRACKER.leave()
                gathered = split_columns(out, [np.shape(leaves[i]) for i in members])
            for i, value in zip(members, gathered):
                shape = np.shape(leaves[i])
                if shape:
                    value = value.reshape((-1,) + tuple(shape[1:]))
                results[i] = value.astype(dtype_of(leaves[i]))
    TRACKER.done(seq)  # an empty tree sends nothing, and must not stay pending
    return jax.tree_util.tree_unflatten(treedef, results)


def wait_pending() -> None:
    """Block until every dispatched cross-process call has run. The fast path's calls carry no
    JAX effect, so jax.effects_barrier() alone does not wait for them; a process must not exit
    while one is still queued, or its peers would wait forever."""
    jax.effects_barrier()
    jax.block_until_ready(list(DEPENDENCY.values()) + xla.LAST)


def barrier(name: str = "barrier", timeout: float | None = None) -> None:
    """Wait until every process gets here (pending cross-process calls finish first).

    `name` says which barrier in the hang report (`barrier 'after-restore' #12`); every process
    must pass the same barriers in the same order. `timeout` (seconds): when this rank has waited
    that long, the job is stopped with a roll-call and the ranks that never arrived named (as
    `collective_timeout` does for every collective; the smaller of the two applies)."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"barrier timeout must be positive seconds, got {timeout!r}")
    wait_pending()
    label = "barrier" if name == "barrier" else f"barrier {name!r}"
    seq = TRACKER.start(label)
    TRACKER.enter(seq, label, timeout=timeout)
    host_comm().Barrier()
    TRACKER.leave()
