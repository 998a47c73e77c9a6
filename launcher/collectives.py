"""Cross-process collectives over pytrees: allreduce, broadcast, allgather, barrier.

How a leaf is read:
- A jax.Array split over several local devices along its leading axis (pmap output, or an array
  sharded over ctx.mesh) holds one contribution per row: allreduce reduces over the rows of all
  processes (the devices of all hosts) and returns the same shape and sharding, every row holding
  the total, like `lax.psum` inside pmap.
- Anything else (numpy array, Python number, an array on one device or replicated) is this
  process's contribution: allreduce reduces over processes and returns the same kind of value.

How it runs: local devices are reduced first, by XLA; then the leaves are grouped by dtype and
each group travels as ONE contiguous buffer in ONE mpi4jax call, jitted on one device. mpi4jax
cannot run inside pmap or a jit spanning several devices (its ordered effect is single-device),
which is why these functions must be called outside jit/pmap.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from mpi4py import MPI

__all__ = ["allreduce", "broadcast", "allgather", "barrier"]

_MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_LOCAL_REDUCERS = {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}
# dtypes MPI has no type for travel as float32 and are cast back.
_WIRE_DTYPES = {"bfloat16": np.float32, "float16": np.float32}


@functools.cache
def _comm():
    # mpi4jax gets a communicator of its own, so its asynchronously dispatched calls never
    # interleave with mpi4py calls made by user code on COMM_WORLD.
    return MPI.COMM_WORLD.Clone()


@functools.cache
def _host_comm():
    # Host leaves travel with mpi4py on a second communicator: mpi4jax calls run asynchronously
    # in XLA's threads, and two threads must never race collectives on one communicator.
    return MPI.COMM_WORLD.Clone()


def _home_device():
    return jax.local_devices()[0]


class _Leaf:
    """One leaf, classified: its kind, and how to turn the reduced value back into its type."""

    __slots__ = ("value", "kind", "shape", "dtype")

    def __init__(self, value, where: str):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"launcher collectives cannot run inside jax.jit, pmap or shard_map ({where} is a tracer). "
                "Call them outside, on concrete arrays; inside pmap use jax.lax.psum over the local devices.")
        if isinstance(value, jax.Array):
            if not value.is_fully_addressable:
                raise ValueError(f"{where} spans devices of other processes (a jax.distributed global array); "
                                 "launcher collectives take per-process arrays")
            self.kind = "jax"
            sharding = value.sharding
            if len(sharding.device_set) > 1 and not sharding.is_fully_replicated:
                shard = sharding.shard_shape(value.shape)
                if value.ndim == 0 or tuple(shard[1:]) != tuple(value.shape[1:]):
                    raise ValueError(
                        f"{where} is sharded along an axis other than the leading one (shape {value.shape}, "
                        f"shard {shard}); shard only the leading axis or reduce locally first")
                self.kind = "stacked"
        elif isinstance(value, (np.ndarray, np.generic)):
            self.kind = "numpy"
        elif isinstance(value, (bool, int, float, complex)):
            self.kind = "python"
        else:
            raise TypeError(f"{where} is a {type(value).__name__}; collectives take arrays and numbers")
        self.value = value
        self.shape = np.shape(value)
        self.dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype

    def restore(self, result):
        """Give the reduced value the input's type and placement."""
        if self.kind == "stacked":
            return jax.device_put(jnp.broadcast_to(result, self.shape), self.value.sharding)
        if self.kind == "jax":
            return jax.device_put(result, self.value.sharding)
        array = np.asarray(result)
        if self.kind == "python":
            return array.item()
        return array if self.kind == "numpy" and isinstance(self.value, np.ndarray) else array[()]


def _flatten(tree, name):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    paths = [f"{name}{jax.tree_util.keystr(p)}" for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    return [_Leaf(v, p) for v, p in zip(leaves, paths)], treedef


def _on_home_device(leaf: _Leaf, op: str | None):
    """The leaf's contribution as one array on the home device (stacked leaves reduced locally)."""
    home = _home_device()
    if leaf.kind == "stacked":
        return jax.device_put(_local_reducer(op)(leaf.value), home)
    return jax.device_put(leaf.value, home)


@functools.cache
def _local_reducer(op: str):
    """Reduce the leading (per-device) axis over the local devices, with XLA."""
    return jax.jit(lambda x: _LOCAL_REDUCERS[op](x, axis=0))


def _groups(leaves, kinds):
    """Indices of the leaves of the given kinds, grouped by wire dtype, in a fixed order so that
    every rank makes the same calls in the same sequence."""
    groups = {}
    for index, leaf in enumerate(leaves):
        if leaf.kind in kinds:
            groups.setdefault(_wire_dtype(leaf.dtype).name, []).append(index)
    return sorted(groups.items())


def _wire_dtype(dtype) -> np.dtype:
    return np.dtype(_WIRE_DTYPES.get(np.dtype(dtype).name, dtype))


DEVICE_KINDS = ("jax", "stacked")
HOST_KINDS = ("numpy", "python")


# --- device leaves: one jit per (dtype group, shapes), one mpi4jax call inside ---------------

def _concat(parts):
    return jnp.concatenate([jnp.ravel(p) for p in parts]) if len(parts) > 1 else jnp.ravel(parts[0])


def _split(flat, shapes):
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


@functools.partial(jax.jit, static_argnames=("op",))
def _fused_allreduce(parts, op):
    return _split(mpi4jax.allreduce(_concat(parts), op=_MPI_OPS[op], comm=_comm()), [p.shape for p in parts])


@functools.partial(jax.jit, static_argnames=("root",))
def _fused_bcast(parts, root):
    return _split(mpi4jax.bcast(_concat(parts), root, comm=_comm()), [p.shape for p in parts])


def _split_columns(gathered, shapes):
    """(size, n) -> one (size, *shape) block per leaf."""
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(gathered[:, start:start + n].reshape((gathered.shape[0],) + tuple(shape)))
        start += n
    return out


@jax.jit
def _fused_allgather(parts):
    gathered = mpi4jax.allgather(_concat(parts), comm=_comm())  # (size, n)
    return _split_columns(gathered, [p.shape for p in parts])


# --- host leaves (numpy, Python numbers): mpi4py on one numpy buffer per dtype -------------
# Host data stays on the host: JAX without x64 would truncate float64/int64, and a round trip
# through a device buffer only to reach MPI would add copies.

def _host_concat(parts):
    return np.concatenate([np.ravel(p) for p in parts]) if parts else np.empty(0)


def _host_allreduce(parts, op):
    buffer = np.ascontiguousarray(_host_concat(parts))
    _host_comm().Allreduce(MPI.IN_PLACE, buffer, op=_MPI_OPS[op])
    return _split(buffer, [np.shape(p) for p in parts])


def _host_bcast(parts, root):
    buffer = np.ascontiguousarray(_host_concat(parts))
    _host_comm().Bcast(buffer, root=root)
    return _split(buffer, [np.shape(p) for p in parts])


def _host_allgather(parts):
    buffer = np.ascontiguousarray(_host_concat(parts))
    gathered = np.empty((_host_comm().Get_size(), buffer.size), buffer.dtype)
    _host_comm().Allgather(buffer, gathered)
    return _split_columns(gathered, [np.shape(p) for p in parts])


def _check_op(op):
    if op not in _MPI_OPS:
        raise ValueError(f"op={op!r} is not supported; use one of {', '.join(_MPI_OPS)}")


def _transport_dtype(dtype, op):
    """The dtype a leaf travels as: bools as integers (sum counts, max/min is any/all),
    dtypes MPI lacks (float16, bfloat16) as float32."""
    if np.dtype(dtype) == np.bool_:
        return np.dtype(np.int32 if op in ("sum", "mean") else np.uint8)
    return _wire_dtype(dtype)


def allreduce(tree, op: str = "sum"):
    """Reduce every leaf over all devices of all processes (see the module doc for leaf kinds).

    op: "sum", "mean", "max" or "min". Every process must call it with the same tree structure,
    shapes and dtypes. Returns a tree of the same structure, each leaf of its input's kind.
    """
    _check_op(op)
    leaves, treedef = _flatten(tree, "tree")
    size = MPI.COMM_WORLD.Get_size()
    wire = [_transport_dtype(leaf.dtype, op) for leaf in leaves]
    results = [None] * len(leaves)
    for on_device in (True, False):
        groups = {}
        for i, leaf in enumerate(leaves):
            if (leaf.kind in DEVICE_KINDS) == on_device:
                groups.setdefault(wire[i].name, []).append(i)
        for _, indices in sorted(groups.items()):
            if on_device:
                parts = [_on_home_device(leaves[i], op).astype(wire[i]) for i in indices]
                reduced = _fused_allreduce(parts, op=op)
            else:
                reduced = _host_allreduce([np.asarray(leaves[i].value, wire[i]) for i in indices], op)
            for i, value in zip(indices, reduced):
                leaf = leaves[i]
                if op == "mean":
                    value = value / (size * (leaf.shape[0] if leaf.kind == "stacked" else 1))
                elif not (leaf.dtype == np.bool_ and op == "sum"):  # a sum of bools is a count
                    value = value.astype(leaf.dtype)
                results[i] = leaf.restore(value)
    return jax.tree_util.tree_unflatten(treedef, results)


def broadcast(tree, root: int = 0):
    """Every process gets the root process's tree (same structure, shapes and dtypes required)."""
    leaves, treedef = _flatten(tree, "tree")
    results = [None] * len(leaves)
    for dtype_name, indices in _groups(leaves, DEVICE_KINDS):
        parts = [jax.device_put(leaves[i].value, _home_device()).astype(dtype_name) for i in indices]
        for i, value in zip(indices, _fused_bcast(parts, root=root)):
            results[i] = leaves[i].restore(value.astype(leaves[i].dtype))
    for dtype_name, indices in _groups(leaves, HOST_KINDS):
        parts = [np.asarray(leaves[i].value, dtype_name) for i in indices]
        for i, value in zip(indices, _host_bcast(parts, root)):
            results[i] = leaves[i].restore(value.astype(leaves[i].dtype))
    return jax.tree_util.tree_unflatten(treedef, results)


def allgather(tree):
    """Concatenate every leaf over processes along its leading axis, in rank order.

    A leaf of shape (n, ...) becomes (size * n, ...); a scalar becomes shape (size,). Stacked
    leaves keep their per-device rows, so the result is in global device order. Results are
    numpy arrays for numpy/Python inputs, and arrays on the first local device for jax inputs.
    """
    leaves, treedef = _flatten(tree, "tree")
    results = [None] * len(leaves)
    for on_device, kinds in ((True, DEVICE_KINDS), (False, HOST_KINDS)):
        for dtype_name, indices in _groups(leaves, kinds):
            if on_device:
                parts = [jax.device_put(leaves[i].value, _home_device()).astype(dtype_name) for i in indices]
                gathered = _fused_allgather(parts)
            else:
                gathered = _host_allgather([np.asarray(leaves[i].value, dtype_name) for i in indices])
            for i, value in zip(indices, gathered):
                leaf = leaves[i]
                if leaf.shape:
                    value = value.reshape((-1,) + tuple(leaf.shape[1:]))
                results[i] = value.astype(leaf.dtype)
    return jax.tree_util.tree_unflatten(treedef, results)


def barrier() -> None:
    """Wait until every process gets here (pending mpi4jax calls finish first)."""
    jax.effects_barrier()
    _host_comm().Barrier()
