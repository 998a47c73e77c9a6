"""The collectives inside the job's own `jax.jit`: a process with one device (one process per GPU,
the usual layout) calls `launcher.allreduce(grads)` in its jitted step, and the exchange becomes part
of that step: XLA concatenates the leaves per wire dtype, makes one MPI call per group (mpi4jax's
FFI target, through transport.py: the same path and rules as outside jit), splits and casts back.
The results are the step's own outputs; nothing is built in Python.

Inside pmap, shard_map or vmap with a named axis, or a jit spanning several devices, there is no one
"this process's value": the collective refuses with a clear error and names `jax.lax.psum` for the
local devices.

What outside-jit calls do and this cannot: tell the watchdog's tracker when the call starts and waits
(it runs later, inside XLA). A hang there is still caught by the hang watchdog, and the roll-call
names the rank's wait as "in XLA, calling <the step>".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from mpi4py import MPI

from . import transport
from .device import fused_allreduce, fused_allgather, fused_bcast
from .leaves import by_wire_dtype, home_device

PSUM_HINT = ("inside pmap or shard_map, reduce the local devices with jax.lax.psum(x, axis_name) and call "
             "launcher.allreduce outside, on the result; or run one device per process (processes_per_node = "
             "the node's GPUs, devices_per_process: 1)")


def is_traced(leaves) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in leaves)


def _refuse_named_axes(name: str) -> None:
    axes = transport.named_axes()
    if axes:
        listing = ", ".join(f"{axis!r} ({size})" for axis, size in axes.items())
        raise ValueError(f"launcher.{name} inside a transformation over the named axis {listing}: it makes one "
                         f"cross-process call per process, and here every device (or batch member) would make "
                         f"its own. Instead, {PSUM_HINT}.")


def _as_arrays(leaves):
    return [leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf) for leaf in leaves]


def _ordered() -> bool:
    """The fast, effect-free primitive is registered for CPU; a GPU uses mpi4jax's public op."""
    return not transport.fast_path_for(home_device())


def allreduce(leaves, treedef, op: str):
    _refuse_named_axes("allreduce")
    parts = _as_arrays(leaves)
    counts = tuple(MPI.COMM_WORLD.Get_size() for _ in parts)  # a mean divides by the processes
    # A jit over several devices is refused when the step is lowered (transport.py says why).
    out, _ = fused_allreduce(parts, jnp.int32(0), op=op, counts=counts, ordered=_ordered())
    return treedef.unflatten(out)


def broadcast(leaves, treedef, root: int):
    _refuse_named_axes("broadcast")
    parts = _as_arrays(leaves)
    results = [None] * len(parts)
    for wire, indices in by_wire_dtype(parts, range(len(parts))):
        sent = fused_bcast([parts[i].astype(wire) for i in indices], root=root)
        for i, value in zip(indices, sent):
            results[i] = value.astype(parts[i].dtype)
    return treedef.unflatten(results)


def allgather(leaves, treedef):
    _refuse_named_axes("allgather")
    parts = _as_arrays(leaves)
    results = [None] * len(parts)
    for wire, indices in by_wire_dtype(parts, range(len(parts))):
        gathered = fused_allgather([parts[i].astype(wire) for i in indices])
        for i, value in zip(indices, gathered):
            shape = parts[i].shape
            results[i] = (value.reshape((-1,) + tuple(shape[1:])) if shape else value).astype(parts[i].dtype)
    return treedef.unflatten(results)
