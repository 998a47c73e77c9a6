"""The device path of allreduce: per-device rows, arrays on other devices, replicated or sharded
arrays, any leaf on a GPU (the staged path, staged.py, takes the common tree on a CPU). Hierarchical
and fused:
1. leaves laid out per device are reduced over the local devices by ONE sharded XLA computation;
2. ONE single-device jit on the first local device takes every device leaf, concatenates the
   leaves of each dtype into one buffer, makes ONE mpi4jax allreduce per dtype (see
   transport.py for why that call skips JAX's ordered-effect dispatch), splits the
   buffers back and casts;
3. per-device leaves get their result copied back to their devices.
Host leaves in such a tree travel with mpi4py, on a communicator of their own (host.py).

Also here: the fused computations of broadcast's and allgather's device leaves (mpi4jax's public
ops, one call per dtype).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from mpi4py import MPI

from . import choice, transport, xla
from .leaves import MPI_OPS, call_groups, concat, home_device, is_on, result_dtype, split, split_columns, wire_dtype

_LOCAL_REDUCERS = {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}


@functools.cache
def _comm():
    """The communicator of our device-side calls, used by nothing else (see transport.py)."""
    return MPI.COMM_WORLD.Clone()


@functools.cache
def _ordered_comm():
    """mpi4jax's public (ordered) ops, for broadcast and allgather."""
    return MPI.COMM_WORLD.Clone()


DEPENDENCY = {}  # device -> int32 counter threaded through every fast-path call, to keep order


@functools.partial(jax.jit, static_argnames=("op", "counts", "ordered"))
def fused_allreduce(parts, dependency, op, counts, ordered):
    """One dispatch: per group, concat -> one MPI allreduce -> split; then mean and casts.
    counts: contributions per part, the divisor of a mean."""
    out = [None] * len(parts)
    for group in call_groups([(p.shape, p.dtype) for p in parts], op):
        wire = wire_dtype(parts[group[0]].dtype, op)
        buffer = concat([parts[i].astype(wire) for i in group])
        reduced = transport.allreduce_flat(buffer, MPI_OPS[op], _comm(), ordered=ordered)
        for i, value in zip(group, split(reduced, [parts[i].shape for i in group])):
            value = value / counts[i] if op == "mean" else value
            out[i] = value.astype(result_dtype(parts[i].dtype, op))
    return out, dependency + 1


def _on_home(array, home):
    """The copy of `array` that lives on `home`, without a transfer when it is already there."""
    if is_on(array.sharding, home):
        return array
    for shard in array.addressable_shards:  # replicated: take the local copy, zero-copy
        if shard.device == home and shard.data.shape == array.shape:
            return shard.data
    return jax.device_put(array, home)


# Per-device ("stacked") leaves move between the local devices and the home device as a few
# flat buffers, never leaf by leaf: every transfer call costs ~0.1 ms of Python per array, so
# 100 leaves moved one by one cost more than the whole allreduce.

def _replicated(sharding):
    mesh = sharding.mesh if isinstance(sharding, NamedSharding) else Mesh(
        np.array(sorted(sharding.device_set, key=lambda d: d.id)), ("devices",))
    return NamedSharding(mesh, PartitionSpec())


@functools.cache
def _local_flattener(op: str, out_sharding):
    """One sharded computation: reduce each stacked leaf over its rows (the local devices) and
    concatenate the results per wire dtype into flat buffers, replicated on the local devices."""
    def flatten(xs):
        groups = {}
        for x in xs:
            groups.setdefault(wire_dtype(x.dtype, op).name, []).append(
                jnp.ravel(_LOCAL_REDUCERS[op](x, axis=0)).astype(wire_dtype(x.dtype, op)))
        return [jnp.concatenate(groups[name]) if len(groups[name]) > 1 else groups[name][0]
                for name in sorted(groups)]
    return jax.jit(flatten, out_shardings=out_sharding)


def _stacked_layout(xs, op):
    """For each flat buffer of _local_flattener (same order): its leaves' positions in xs."""
    groups = {}
    for position, x in enumerate(xs):
        groups.setdefault(wire_dtype(x.dtype, op).name, []).append(position)
    return [groups[name] for name in sorted(groups)]


@functools.cache
def _spreader(layout, out_shardings):
    """Split the reduced flat buffers back into leaves, each broadcast to its per-device rows,
    divided by its count (mean) and cast, laid out like its input."""
    def spread(flats):
        out = [None] * sum(len(group) for group, _ in layout)
        for flat, (group, leaves) in zip(flats, layout):
            pieces = split(flat, [shape for _, shape, _, _ in leaves])
            for position, piece, (rows, _, count, dtype) in zip(group, pieces, leaves):
                value = (piece / count if count else piece).astype(dtype)
                out[position] = jnp.broadcast_to(value, (rows,) + value.shape)
        return out
    return jax.jit(spread, out_shardings=list(out_shardings))


def allreduce_device_leaves(leaves, kinds, indices, op, results):
    home = home_device()
    size = MPI.COMM_WORLD.Get_size()
    stacked = [i for i in indices if kinds[i] == "stacked"]
    single = [i for i in indices if kinds[i] != "stacked"]
    inputs = [leaves[i] if kinds[i] == "home" else _on_home(leaves[i], home) for i in single]
    if stacked:
        xs = [leaves[i] for i in stacked]
        replicated = _replicated(xs[0].sharding)
        flats = [_on_home(f, home) for f in _local_flattener(op, replicated)(xs)]
        layout = _stacked_layout(xs, op)
        inputs += flats
    # counts: contributions per leaf, for mean (stacked buffers are divided later, leaf by leaf)
    counts = tuple([size] * len(single) + [1] * (len(inputs) - len(single)))
    if choice.current() == "xla":
        outputs = xla.allreduce(inputs, op, counts)
        marker = outputs[-1]
    else:
        if home not in DEPENDENCY:
            DEPENDENCY[home] = jax.device_put(jnp.zeros((), jnp.int32), home)
        outputs, DEPENDENCY[home] = fused_allreduce(inputs, DEPENDENCY[home], op=op, counts=counts,
                                                      ordered=not transport.fast_path_for(home))
        marker = DEPENDENCY[home]
    moves = []
    for i, value in zip(single, outputs):
        if kinds[i] == "home":
            results[i] = value
        else:
            moves.append((i, value, leaves[i].sharding))
    if moves:
        placed = jax.device_put([v for _, v, _ in moves], [s for _, _, s in moves])
        for (i, _, _), value in zip(moves, placed):
            results[i] = value
    if stacked:
        reduced_flats = jax.device_put(list(outputs[len(single):]), replicated)  # one transfer per dtype
        spec = tuple((tuple(group), tuple((xs[p].shape[0], xs[p].shape[1:], size * xs[p].shape[0]
                                            if op == "mean" else 0, result_dtype(xs[p].dtype, op).name)
                                           for p in group)) for group in layout)
        for i, value in zip(stacked, _spreader(spec, tuple(x.sharding for x in xs))(reduced_flats)):
            results[i] = value
    return marker  # ready when the cross-process step has run


# --- broadcast and allgather: public mpi4jax ops, fused per dtype -------------------------

@functools.partial(jax.jit, static_argnames=("root",))
def fused_bcast(parts, root):
    return split(transport.require_mpi4jax().bcast(concat(parts), root, comm=_ordered_comm()), [p.shape for p in parts])


@jax.jit
def fused_allgather(parts):
    gathered = transport.require_mpi4jax().allgather(concat(parts), comm=_ordered_comm())  # (size, n)
    return split_columns(gathered, [p.shape for p in parts])
