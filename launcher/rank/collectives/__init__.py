"""Cross-process collectives over pytrees: allreduce, broadcast, allgather, barrier.

How a leaf is read:
- A jax.Array laid out one row per local device (pmap output, or shape (devices, ...) sharded
  over ctx.mesh along its first axis) holds one contribution per device: allreduce reduces over
  the devices of all hosts and returns the same shape and sharding, every row holding the total,
  like `lax.psum` inside pmap.
- Anything else (numpy array, Python number, an array on one device, replicated, or sharded in
  any other way, such as a model-parallel weight) is this process's contribution: allreduce
  reduces over processes and returns the same kind of value, with the same sharding.

How allreduce and broadcast run. The common tree (arrays on the first local device of a CPU
process, NumPy arrays, Python numbers) is *staged through host memory* by a plan cached per
signature (each leaf's kind, shape and dtype):
1. the leaves of each wire dtype are copied into one host buffer, which is reduced in place
   by ONE mpi4py call (in place is cheaper than out of place, the only form mpi4jax's handler
   has: no extra copy inside MPI, and that pays for ours); a lone leaf (a loss, a packed buffer)
   is sent from where it lies into a fresh buffer, without any copy. On the CPU a device array is
   host memory: reading it costs no transfer, only the wait until it is computed, which happens
   before the tracker counts the collective as started (a slow step is no hang);
2. each device leaf comes back by one host-to-device put: a buffer that holds one leaf is handed
   to JAX without a copy (64-byte aligned, as XLA needs), the leaves of a shared buffer are copied
   out, so that a result never keeps its neighbours' memory alive.
Leaves of 4 MiB or more travel alone, to save the copy out. Host leaves keep their float64/int64
exactness (JAX without x64 would truncate them). Broadcast moves the raw bytes of every leaf in one
buffer, whatever their dtypes. A lone array skips the tree machinery altogether.

Everything else (per-device rows, arrays on other devices, replicated or sharded arrays, any
leaf on a GPU) goes the device way, hierarchical and fused:
1. leaves laid out per device are reduced over the local devices by ONE sharded XLA computation;
2. ONE single-device jit on the first local device takes every device leaf, concatenates the
   leaves of each dtype into one buffer, makes ONE mpi4jax allreduce per dtype (see
   launcher/rank/collectives/transport.py for why that call skips JAX's ordered-effect dispatch), splits the
   buffers back and casts;
3. per-device leaves get their result copied back to their devices.
Host leaves in such a tree travel with mpi4py, on a communicator of their own.

mpi4jax cannot run inside pmap or a jit spanning several devices, so these functions must be
called outside jit/pmap; inside, reduce the local devices with `jax.lax.psum` as usual.
Every process must call them in the same order with the same tree structure, shapes, dtypes and
placements. They are not thread-safe: call them from one thread.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from mpi4py import MPI

from . import transport
from ..tracker import TRACKER

__all__ = ["allreduce", "broadcast", "allgather", "barrier", "TreePacker"]

_MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
_LOCAL_REDUCERS = {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}
# dtypes MPI has no type for travel as float32 and are cast back.
_WIRE_DTYPES = {"bfloat16": np.dtype(np.float32), "float16": np.dtype(np.float32)}
# Leaves this large get an MPI call of their own: a 16 MiB concat + split costs more than a call.
SOLO_BYTES = 4 << 20

DEVICE_KINDS = ("home", "jax", "stacked")
HOST_KINDS = ("numpy", "python")


@functools.cache
def _comm():
    """The communicator of our device-side calls, used by nothing else (see transport.py)."""
    return MPI.COMM_WORLD.Clone()


@functools.cache
def _ordered_comm():
    """mpi4jax's public (ordered) ops, for broadcast and allgather."""
    return MPI.COMM_WORLD.Clone()


@functools.cache
def _host_comm():
    # Host leaves travel with mpi4py from this thread while mpi4jax calls run in XLA's threads;
    # two threads must never race collectives on one communicator. The first call is collective
    # (a Clone): make it inside the tracker's enter/leave, or a rank that never comes is not named.
    return MPI.COMM_WORLD.Clone()


@functools.cache
def _home_device():
    return jax.local_devices()[0]


_dependency = {}  # device -> int32 counter threaded through every fast-path call, to keep order


def _leaf_name(tree, index: int) -> str:
    """`tree['a'][0]`-style name of a leaf, computed only for error messages."""
    path, _ = jax.tree_util.tree_flatten_with_path(tree)[0][index]
    return "tree" + jax.tree_util.keystr(path)


def _classify(value, tree, index, home=None) -> str:
    """'home' (on the first local device: the common, cheapest case), 'jax' (on another single
    device, or replicated), 'stacked' (one row per local device), 'numpy' or 'python'."""
    if isinstance(value, jax.Array):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"launcher collectives cannot run inside jax.jit, pmap or shard_map ({_leaf_name(tree, index)} "
                "is a tracer). Call them outside, on concrete arrays; inside pmap use jax.lax.psum over the "
                "local devices.")
        sharding = value.sharding
        if isinstance(sharding, SingleDeviceSharding):
            return "home" if home is not None and _is_on(sharding, home) else "jax"
        if not value.is_fully_addressable:
            raise ValueError(f"{_leaf_name(tree, index)} spans devices of other processes (a jax.distributed "
                             "global array); launcher collectives take per-process arrays")
        if len(sharding.device_set) == 1 or sharding.is_fully_replicated:
            return "jax"
        shard = sharding.shard_shape(value.shape)
        if (value.ndim and value.shape[0] == len(sharding.device_set) and shard[0] == 1
                and tuple(shard[1:]) == tuple(value.shape[1:])):
            return "stacked"
        return "jax"  # any other layout (e.g. a model-parallel weight) is one per-process value
    if isinstance(value, (np.ndarray, np.generic)):
        return "numpy"
    if isinstance(value, (bool, int, float, complex)):
        return "python"
    raise TypeError(f"{_leaf_name(tree, index)} is a {type(value).__name__}; collectives take arrays and numbers")


def _wire_dtype(dtype, op: str | None = None) -> np.dtype:
    """The dtype a leaf travels as: bools as integers (a sum counts; max/min is any/all), and
    dtypes MPI lacks (float16, bfloat16) as float32."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_ and op is not None:
        return np.dtype(np.int32 if op in ("sum", "mean") else np.uint8)
    return _WIRE_DTYPES.get(dtype.name, dtype)


def _result_dtype(dtype, op: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if op == "mean":  # bfloat16 is no NumPy inexact type, yet a float: its mean stays bfloat16
        return dtype if np.issubdtype(dtype, np.inexact) or dtype.name in _WIRE_DTYPES else np.dtype(np.float32)
    if dtype == np.bool_ and op == "sum":
        return np.dtype(np.int32)  # a sum of bools is a count
    return dtype


def _groups(shapes_dtypes, op):
    """Leaf indices per MPI call: leaves of SOLO_BYTES or more alone, the rest one group per wire
    dtype. Deterministic, so every rank makes the same calls in the same order."""
    solo, by_dtype = [], {}
    for i, (shape, dtype) in enumerate(shapes_dtypes):
        wire = _wire_dtype(dtype, op)
        if math.prod(shape) * wire.itemsize >= SOLO_BYTES:
            solo.append([i])
        else:
            by_dtype.setdefault(wire.name, []).append(i)
    return solo + [by_dtype[name] for name in sorted(by_dtype)]


def _split(flat, shapes):
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


def _concat(parts):
    flat = [jnp.ravel(p) for p in parts]
    return flat[0] if len(flat) == 1 else jnp.concatenate(flat)


# --- device leaves ------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("op", "counts", "ordered"))
def _fused_allreduce(parts, dependency, op, counts, ordered):
    """One dispatch: per group, concat -> one MPI allreduce -> split; then mean and casts.
    counts: contributions per part, the divisor of a mean."""
    out = [None] * len(parts)
    for group in _groups([(p.shape, p.dtype) for p in parts], op):
        wire = _wire_dtype(parts[group[0]].dtype, op)
        buffer = _concat([parts[i].astype(wire) for i in group])
        reduced = transport.allreduce_flat(buffer, _MPI_OPS[op], _comm(), ordered=ordered)
        for i, value in zip(group, _split(reduced, [parts[i].shape for i in group])):
            value = value / counts[i] if op == "mean" else value
            out[i] = value.astype(_result_dtype(parts[i].dtype, op))
    return out, dependency + 1


def _is_on(sharding, device) -> bool:
    return isinstance(sharding, SingleDeviceSharding) and next(iter(sharding.device_set)) == device


def _on_home(array, home):
    """The copy of `array` that lives on `home`, without a transfer when it is already there."""
    if _is_on(array.sharding, home):
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
            groups.setdefault(_wire_dtype(x.dtype, op).name, []).append(
                jnp.ravel(_LOCAL_REDUCERS[op](x, axis=0)).astype(_wire_dtype(x.dtype, op)))
        return [jnp.concatenate(groups[name]) if len(groups[name]) > 1 else groups[name][0]
                for name in sorted(groups)]
    return jax.jit(flatten, out_shardings=out_sharding)


def _stacked_layout(xs, op):
    """For each flat buffer of _local_flattener (same order): its leaves' positions in xs."""
    groups = {}
    for position, x in enumerate(xs):
        groups.setdefault(_wire_dtype(x.dtype, op).name, []).append(position)
    return [groups[name] for name in sorted(groups)]


@functools.cache
def _spreader(layout, out_shardings):
    """Split the reduced flat buffers back into leaves, each broadcast to its per-device rows,
    divided by its count (mean) and cast, laid out like its input."""
    def spread(flats):
        out = [None] * sum(len(group) for group, _ in layout)
        for flat, (group, leaves) in zip(flats, layout):
            pieces = _split(flat, [shape for _, shape, _, _ in leaves])
            for position, piece, (rows, _, count, dtype) in zip(group, pieces, leaves):
                value = (piece / count if count else piece).astype(dtype)
                out[position] = jnp.broadcast_to(value, (rows,) + value.shape)
        return out
    return jax.jit(spread, out_shardings=list(out_shardings))


def _allreduce_device_leaves(leaves, kinds, indices, op, results):
    home = _home_device()
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
    if home not in _dependency:
        _dependency[home] = jax.device_put(jnp.zeros((), jnp.int32), home)
    outputs, _dependency[home] = _fused_allreduce(inputs, _dependency[home], op=op, counts=counts,
                                                  ordered=not transport.fast_path_for(home))
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
                                            if op == "mean" else 0, _result_dtype(xs[p].dtype, op).name)
                                           for p in group)) for group in layout)
        for i, value in zip(stacked, _spreader(spec, tuple(x.sharding for x in xs))(reduced_flats)):
            results[i] = value


# --- host leaves (numpy, Python numbers): mpi4py on one numpy buffer per dtype -------------

def _host_concat(parts):
    return np.concatenate([np.ravel(p) for p in parts]) if parts else np.empty(0)


def _split_columns(gathered, shapes):
    """(size, n) -> one (size, *shape) block per leaf."""
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(gathered[:, start:start + n].reshape((gathered.shape[0],) + tuple(shape)))
        start += n
    return out


def _restore_host(value, original, kind):
    array = np.asarray(value)
    if kind == "python":
        return array.item()
    return array if isinstance(original, np.ndarray) else array[()]


def _allreduce_host_leaves(leaves, kinds, indices, op, results):
    size = _host_comm().Get_size()
    arrays = {i: np.asarray(leaves[i]) for i in indices}
    for group in _groups([(arrays[i].shape, arrays[i].dtype) for i in indices], op):
        members = [indices[g] for g in group]
        wire = _wire_dtype(arrays[members[0]].dtype, op)
        buffer = np.ascontiguousarray(_host_concat([arrays[i].astype(wire, copy=False) for i in members]))
        _host_comm().Allreduce(MPI.IN_PLACE, buffer, op=_MPI_OPS[op])
        for i, value in zip(members, _split(buffer, [arrays[i].shape for i in members])):
            value = value / size if op == "mean" else value.astype(_result_dtype(arrays[i].dtype, op))
            results[i] = _restore_host(value, leaves[i], kinds[i])


# --- the staged path: the common tree through host memory (see the module doc) ------------

def _device_put(aval, sharding, values, devices, committed, copy):
    """jax.device_put with the signature of jaxlib's batched_device_put (used when that is missing)."""
    return jax.device_put(values[0], devices[0], may_alias=not copy)


try:  # the host-to-device put under jax.device_put, without its ~30 us of Python per array
    from jax._src.array import ArrayImpl as _ArrayImpl
    from jax._src.lib import xla_client as _xla_client

    _put = _xla_client.batched_device_put
except (ImportError, AttributeError):  # JAX internals moved: jax.device_put does the same, slower
    _ArrayImpl = jax.Array  # never a leaf's exact type: no device leaf is staged then
    _put = _device_put

try:  # jaxlib lets go of a put's host buffer only at its next collection (see _buffer)
    from jax._src.lib import _jax

    _release_dead_buffers = _jax.collect_garbage
except (ImportError, AttributeError):
    def _release_dead_buffers():
        pass

STAGED = True  # tests turn it off to run the device path on the CPU too
ALIGNMENT = 64  # XLA's CPU client takes a host buffer without a copy only at this alignment
ALIGN_FROM = 16 << 10  # bytes: a smaller lone leaf is just copied (handing it over buys nothing)
_PYTHON_DTYPES = {bool: np.dtype(np.bool_), int: np.asarray(0).dtype, float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}
_home_shardings = {}  # id -> a sharding object found equal to the home device's: one comparison each
STAGING_BUFFERS = 4  # staging buffers kept for reuse, one per (dtype, size), the most recently used
STAGING_KEPT_BYTES = 256 << 20  # a larger one is not kept: its memory is not held between calls
_STAGING: dict = {}  # (wire dtype, elements) -> a staging buffer, oldest first


@functools.cache
def _home_sharding():
    return SingleDeviceSharding(_home_device())


@functools.cache
def _home_devices():
    return [_home_device()]


@functools.cache
def _home_is_cpu() -> bool:
    return _home_device().platform == "cpu"


def _is_home_sharding(sharding) -> bool:
    if _home_shardings.get(id(sharding)) is sharding:
        return True
    if sharding != _home_sharding():
        return False
    if len(_home_shardings) >= 256:  # a job that makes new sharding objects all the time
        _home_shardings.clear()
    _home_shardings[id(sharding)] = sharding  # kept alive, so its id is not reused meanwhile
    return True


def _mpi_dtype_ok(dtype) -> bool:
    """MPI has a type for it, or it travels as one that has (bfloat16, float16)."""
    return dtype.kind in "biufc" or dtype.name in _WIRE_DTYPES


def _staged_signature(leaves):
    """(kind, shape, dtype) per leaf when every leaf can be staged through host memory: a jax.Array
    on the home device of a CPU process, a NumPy array or scalar, a Python number. None otherwise."""
    if not (STAGED and _home_is_cpu()):
        return None
    signature = []
    for leaf in leaves:
        cls = type(leaf)
        if cls is _ArrayImpl:
            if not (_is_home_sharding(leaf.sharding) and _mpi_dtype_ok(leaf.dtype)):
                return None
            signature.append(("device", leaf.shape, leaf.dtype))
        elif cls is np.ndarray:
            if not _mpi_dtype_ok(leaf.dtype):
                return None
            signature.append(("numpy", leaf.shape, leaf.dtype))
        elif cls in _PYTHON_DTYPES:
            signature.append(("python", (), _PYTHON_DTYPES[cls]))
        elif isinstance(leaf, np.generic) and _mpi_dtype_ok(leaf.dtype):
            signature.append(("scalar", (), leaf.dtype))
        else:
            return None  # tracers, other placements, other types: the general path sorts them out
    return tuple(signature)


class _StagedLeaf(NamedTuple):
    index: int          # in the flattened tree
    kind: str           # "device", "numpy", "scalar" or "python"
    shape: tuple
    dtype: np.dtype     # the input's
    start: int          # where it sits in its group's buffer, in the buffer's elements
    stop: int
    result: np.dtype    # what a device leaf comes back as
    aval: object        # the result's abstract value, for device leaves; None for host leaves


class _StagedGroup(NamedTuple):
    """The leaves of one buffer and one MPI call."""
    wire: np.dtype
    size: int           # in elements
    leaves: tuple
    plain: bool         # device leaves only, coming back in the wire dtype as they are: the short loop


def _staged_group(wire, size, leaves, op=None):
    plain = op != "mean" and all(leaf.aval is not None and leaf.result == wire for leaf in leaves)
    return _StagedGroup(wire, size, tuple(leaves), plain)


def _staged_leaf(index, kind, shape, dtype, start, stop, result):
    aval = jax.core.ShapedArray(shape, result) if kind == "device" else None
    return _StagedLeaf(index, kind, shape, dtype, start, stop, result, aval)


@functools.lru_cache(maxsize=256)
def _allreduce_plan(signature, op):
    """The groups of _groups (the same calls in the same order on every rank), laid out."""
    groups = []
    for members in _groups([(shape, dtype) for _, shape, dtype in signature], op):
        staged, start = [], 0
        for i in members:
            kind, shape, dtype = signature[i]
            stop = start + math.prod(shape)
            staged.append(_staged_leaf(i, kind, shape, dtype, start, stop, _result_dtype(dtype, op)))
            start = stop
        groups.append(_staged_group(_wire_dtype(signature[members[0]][2], op), start, staged, op))
    return tuple(groups)


@functools.lru_cache(maxsize=256)
def _broadcast_plan(signature):
    """One buffer, one MPI call: a lone leaf in its own dtype, several leaves as bytes (each at an
    aligned offset), whatever their dtypes."""
    if len(signature) == 1:
        ((kind, shape, dtype),) = signature
        size = math.prod(shape)
        return _staged_group(dtype, size, [_staged_leaf(0, kind, shape, dtype, 0, size, dtype)])
    staged, start = [], 0
    for i, (kind, shape, dtype) in enumerate(signature):
        stop = start + math.prod(shape) * dtype.itemsize
        staged.append(_staged_leaf(i, kind, shape, dtype, start, stop, dtype))
        start = -(-stop // ALIGNMENT) * ALIGNMENT
    return _staged_group(np.dtype(np.uint8), start, staged)


def _buffer(shape, dtype) -> np.ndarray:
    """A fresh buffer; a large one starts on an ALIGNMENT boundary, so that it can become a result
    without a copy."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < ALIGN_FROM:
        return np.empty(shape, dtype)
    # The buffers of results that died since are freed first, so that this one takes their memory,
    # still in cache: MPI into a 4 MiB buffer whose memory alternated took 2x as long (measured).
    _release_dead_buffers()
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _staging_buffer(group) -> np.ndarray:
    """The flat buffer of a group of several leaves. Their results are copied out of it, so the
    buffer of an earlier call of the same dtype and size is taken again once nothing holds it (jaxlib
    lets go of a put's view only at its next collection, so it is collected first). A fresh one each
    call cost a page fault per 4 KiB whenever malloc had handed the last one back to the kernel: a
    100-leaf 4 MiB tree kept across calls took 3.8-4.3 ms instead of 1.4-1.7 ms in half of the 2-rank
    runs under a plain mpirun. jaxlaunch's ranks escape that through the malloc settings of
    launch.RANK_ENV_DEFAULTS; this holds without them too (a spec whose env sets GLIBC_TUNABLES for
    something else, a script under its own mpirun)."""
    key = (group.wire, group.size)
    _release_dead_buffers()
    buffer = _STAGING.pop(key, None)
    if buffer is None or sys.getrefcount(buffer) > 2:  # held elsewhere (the local name and the call's argument)
        buffer = np.empty(group.size, group.wire)
    if buffer.nbytes <= STAGING_KEPT_BYTES:
        _STAGING[key] = buffer  # the newest last; the oldest go beyond STAGING_BUFFERS
        while len(_STAGING) > STAGING_BUFFERS:
            del _STAGING[next(iter(_STAGING))]
    return buffer


def _empty(group) -> np.ndarray:
    """A buffer for the group: flat for several leaves (reused, see _staging_buffer), fresh and in
    its shape for a lone leaf (it becomes the result)."""
    if len(group.leaves) > 1:
        return _staging_buffer(group)
    return _buffer(group.leaves[0].shape, group.wire)


def _gather(leaves, group) -> np.ndarray:
    """The group's leaves in one fresh buffer (see _empty). Reading a device leaf waits until it is
    computed; on the CPU it is host memory, so there is no transfer."""
    buffer = _empty(group)
    if len(group.leaves) == 1:
        buffer[...] = np.asarray(leaves[group.leaves[0].index])
    elif group.wire == np.uint8:  # bytes of any dtypes (broadcast)
        for leaf in group.leaves:
            buffer[leaf.start:leaf.stop] = np.asarray(leaves[leaf.index]).reshape(-1).view(np.uint8)
    else:
        for leaf in group.leaves:
            buffer[leaf.start:leaf.stop] = np.asarray(leaves[leaf.index]).reshape(-1)
    return buffer


def _stage(leaves, group):
    """(send, receive) buffers of the group's MPI call. Several leaves are copied into one buffer,
    reduced in place (in place costs less than out of place, which pays for the copy); a lone leaf
    is sent from where it lies to a buffer of its own: no copy at all."""
    if len(group.leaves) > 1:
        return MPI.IN_PLACE, _gather(leaves, group)
    return np.ascontiguousarray(leaves[group.leaves[0].index], group.wire), _empty(group)


def _allreduce_tracked(pairs, op) -> int:
    """The MPI calls of one launcher allreduce, one collective for the watchdog (pending only while
    in MPI: the inputs were waited for before). Returns the number of processes."""
    seq = TRACKER.start("allreduce")
    TRACKER.enter(seq, "allreduce")
    try:
        comm = _host_comm()
        for send, receive in pairs:
            comm.Allreduce(send, receive, op=_MPI_OPS[op])
    finally:
        TRACKER.leave()
    return comm.Get_size()


def _bcast_tracked(buffer, root) -> None:
    """One launcher broadcast's MPI call, on the buffer's bytes (MPI has no type for bfloat16)."""
    seq = TRACKER.start("broadcast")
    TRACKER.enter(seq, "broadcast")
    try:
        _host_comm().Bcast(buffer.reshape(-1).view(np.uint8), root=root)
    finally:
        TRACKER.leave()


def _allreduce_staged(leaves, groups, op):
    staged = [_stage(leaves, group) for group in groups]  # waits for the inputs: before the tracker
    processes = _allreduce_tracked(staged, op)
    sharding, devices = _home_sharding(), _home_devices()
    results = [None] * len(leaves)
    for group, (_, buffer) in zip(groups, staged):
        if group.plain and len(group.leaves) == 1:  # its own buffer becomes the result: no copy
            leaf = group.leaves[0]
            results[leaf.index] = _put(leaf.aval, sharding, [buffer], devices, True, False)
        elif group.plain:  # copied out: a result must not keep its neighbours' memory alive
            for leaf in group.leaves:
                results[leaf.index] = _put(leaf.aval, sharding, [buffer[leaf.start:leaf.stop].reshape(leaf.shape)],
                                           devices, True, True)
        else:
            _unpack_reduced(leaves, group, buffer, op, processes, results)
    return results


def _unpack_reduced(leaves, group, buffer, op, processes, results):
    """A group with a mean, casts or host leaves: the device path's rules for device leaves, the host
    path's for host leaves (a mean is value / processes; the rest keeps its dtype)."""
    alone = len(group.leaves) == 1  # a buffer of its own is the result's to keep
    divided = op == "mean" and buffer.dtype.kind in "fc"
    if divided:  # one pass over the buffer rather than an array per leaf
        np.divide(buffer, processes, out=buffer)
    for leaf in group.leaves:
        value, fresh = (buffer, True) if alone else (buffer[leaf.start:leaf.stop].reshape(leaf.shape), False)
        if op == "mean" and not divided:
            value, fresh = value / processes, True
        if leaf.aval is not None:
            if value.dtype != leaf.result:
                value, fresh = value.astype(leaf.result), True
            results[leaf.index] = _put(leaf.aval, _home_sharding(), [value], _home_devices(), True, not fresh)
        else:
            if op != "mean" and value.dtype != leaf.result:
                value, fresh = value.astype(leaf.result), True
            results[leaf.index] = _restore_host(value if fresh else value.copy(), leaves[leaf.index], leaf.kind)


@functools.lru_cache(maxsize=256)
def _result_aval(shape, dtype):
    return jax.core.ShapedArray(shape, dtype)


def _allreduce_one_array(x, op):
    """launcher.allreduce(x) of one array on the home device that comes back in its own dtype: the
    commonest call (a loss, a count, a packed gradient buffer), as the staged path makes it, without
    the tree machinery around it (~10 us of Python). None when x is not such an array."""
    dtype = x.dtype
    if not (STAGED and dtype.kind in ("fc" if op == "mean" else "iufc") and dtype.name not in _WIRE_DTYPES
            and _home_is_cpu() and _is_home_sharding(x.sharding)):
        return None  # float16 travels as float32, as in a tree: that is the general path's work
    send = np.asarray(x)  # waits until x is computed: before the tracker
    buffer = _buffer(send.shape, dtype)
    processes = _allreduce_tracked([(send, buffer)], op)
    if op == "mean":
        np.divide(buffer, processes, out=buffer)
    return _put(_result_aval(send.shape, dtype), _home_sharding(), [buffer], _home_devices(), True, False)


def _broadcast_one_array(x, root):
    """launcher.broadcast(x) of one array on the home device, as the staged path makes it, without the
    tree machinery. None when x is not such an array."""
    if not (STAGED and _home_is_cpu() and _is_home_sharding(x.sharding)):
        return None
    buffer = _buffer(x.shape, x.dtype)
    if MPI.COMM_WORLD.Get_rank() == root:  # elsewhere the value is overwritten: no need to read (or wait for) it
        buffer[...] = np.asarray(x)
    _bcast_tracked(buffer, root)
    return _put(_result_aval(x.shape, x.dtype), _home_sharding(), [buffer], _home_devices(), True, False)


def _broadcast_staged(leaves, group, root):
    # elsewhere than at the root the values are overwritten: no need to read (or wait for) them
    buffer = _gather(leaves, group) if MPI.COMM_WORLD.Get_rank() == root else _empty(group)
    _bcast_tracked(buffer, root)
    sharding, devices = _home_sharding(), _home_devices()
    if len(group.leaves) == 1:
        leaf = group.leaves[0]
        if leaf.aval is None:
            return [_restore_host(buffer, leaves[0], leaf.kind)]
        return [_put(leaf.aval, sharding, [buffer], devices, True, False)]
    results = []
    for leaf in group.leaves:
        value = buffer[leaf.start:leaf.stop].view(leaf.dtype).reshape(leaf.shape)
        if leaf.aval is None:
            results.append(_restore_host(value.copy(), leaves[leaf.index], leaf.kind))
        else:
            results.append(_put(leaf.aval, sharding, [value], devices, True, True))
    return results


def _check_op(op):
    if op not in _MPI_OPS:
        raise ValueError(f"op={op!r} is not supported; use one of {', '.join(_MPI_OPS)}")


def allreduce(tree, op: str = "sum"):
    """Reduce every leaf over all devices of all processes (see the module doc for leaf kinds).

    op: "sum", "mean", "max" or "min". Returns a tree of the same structure, each leaf of its
    input's kind and placement. A sum of bools counts; max/min of bools are any/all.
    """
    _check_op(op)
    if type(tree) is _ArrayImpl:
        result = _allreduce_one_array(tree, op)
        if result is not None:
            return result
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        return tree
    signature = _staged_signature(leaves)
    if signature is not None:
        return treedef.unflatten(_allreduce_staged(leaves, _allreduce_plan(signature, op), op))
    home = _home_device()
    kinds = [_classify(v, tree, i, home) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    on_device = [i for i, k in enumerate(kinds) if k in DEVICE_KINDS]
    on_host = [i for i, k in enumerate(kinds) if k in HOST_KINDS]
    seq = TRACKER.start("allreduce")
    if on_device:
        _allreduce_device_leaves(leaves, kinds, on_device, op, results)
        TRACKER.dispatched(seq, "allreduce", _dependency[home])
    if on_host:
        TRACKER.enter(seq, "allreduce")
        _allreduce_host_leaves(leaves, kinds, on_host, op, results)
        TRACKER.leave()
    return jax.tree_util.tree_unflatten(treedef, results)


class TreePacker:
    """Flatten a pytree into ONE buffer inside your own jitted code, and back.

    `launcher.allreduce(tree)` concatenates the leaves itself, outside your jit: for a gradient
    tree of many leaves that is extra dispatches and copies on every step. A packer moves that
    work into the functions the job jits anyway, so the exchange is one buffer and one MPI call:

        packer = launcher.TreePacker(params)              # the structure, shapes and dtype

        @jax.jit
        def grad_step(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return loss, packer.pack(grads)               # (total size,) float32, made inside the jit

        @jax.jit
        def update(params, flat):
            grads = packer.unpack(flat)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

        loss, flat = grad_step(params, x, y)
        params = update(params, launcher.allreduce(flat, op="mean"))

    Under pmap, `pack` gives each device's row and `allreduce` reduces the rows over every device
    of every process, as it does for any per-device leaf. Every leaf must have the same dtype
    (the buffer's); `like` may hold arrays or jax.ShapeDtypeStruct.
    """

    def __init__(self, like):
        leaves, self.treedef = jax.tree_util.tree_flatten(like)
        if not leaves:
            raise ValueError("TreePacker needs a tree with at least one array")
        dtypes = {np.dtype(leaf.dtype) for leaf in leaves}
        if len(dtypes) != 1:
            raise TypeError(f"TreePacker packs leaves of one dtype; this tree has {sorted(map(str, dtypes))}. "
                            "Cast the tree first, or pack each dtype's leaves apart.")
        self.dtype = dtypes.pop()
        self.shapes = [tuple(leaf.shape) for leaf in leaves]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        self.size = sum(self.sizes)

    def pack(self, tree):
        """The leaves, flattened and concatenated (traceable: call it inside jit or pmap)."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self.treedef:
            raise ValueError(f"TreePacker.pack: the tree's structure {treedef} is not the packer's {self.treedef}")
        return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])

    def unpack(self, flat):
        """The tree back from a buffer `pack` made (traceable)."""
        offsets = np.cumsum([0, *self.sizes])
        leaves = [flat[start:end].reshape(shape) for start, end, shape in zip(offsets[:-1], offsets[1:], self.shapes)]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)


# --- broadcast and allgather: public mpi4jax ops, fused per dtype -------------------------

@functools.partial(jax.jit, static_argnames=("root",))
def _fused_bcast(parts, root):
    return _split(mpi4jax.bcast(_concat(parts), root, comm=_ordered_comm()), [p.shape for p in parts])


@jax.jit
def _fused_allgather(parts):
    gathered = mpi4jax.allgather(_concat(parts), comm=_ordered_comm())  # (size, n)
    return _split_columns(gathered, [p.shape for p in parts])


def _dtype_of(value) -> np.dtype:
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype


def _by_wire_dtype(leaves, indices):
    """[(wire dtype name, leaf indices)] in a fixed order, the same on every rank."""
    groups = {}
    for i in indices:
        groups.setdefault(_wire_dtype(_dtype_of(leaves[i])).name, []).append(i)
    return sorted(groups.items())


def broadcast(tree, root: int = 0):
    """Every process gets the root process's tree (same structure, shapes and dtypes required)."""
    if type(tree) is _ArrayImpl:
        result = _broadcast_one_array(tree, root)
        if result is not None:
            return result
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    signature = _staged_signature(leaves) if leaves else None
    if signature is not None:
        return treedef.unflatten(_broadcast_staged(leaves, _broadcast_plan(signature), root))
    kinds = [_classify(v, tree, i) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    device = [i for i, k in enumerate(kinds) if k in DEVICE_KINDS]
    host = [i for i, k in enumerate(kinds) if k in HOST_KINDS]
    home = _home_device()
    seq = TRACKER.start("broadcast")
    for wire, indices in _by_wire_dtype(leaves, device):
        parts = [jax.device_put(leaves[i], home).astype(wire) for i in indices]
        reduced = _fused_bcast(parts, root=root)
        TRACKER.dispatched(seq, "broadcast", reduced[-1])
        for i, value in zip(indices, reduced):
            results[i] = jax.device_put(value.astype(leaves[i].dtype), leaves[i].sharding)
    for wire, indices in _by_wire_dtype(leaves, host):
        buffer = np.ascontiguousarray(_host_concat([np.asarray(leaves[i], wire) for i in indices]))
        TRACKER.enter(seq, "broadcast")
        _host_comm().Bcast(buffer, root=root)
        TRACKER.leave()
        for i, value in zip(indices, _split(buffer, [np.shape(leaves[i]) for i in indices])):
            results[i] = _restore_host(value.astype(_dtype_of(leaves[i])), leaves[i], kinds[i])
    TRACKER.done(seq)  # an empty tree sends nothing, and must not stay pending
    return jax.tree_util.tree_unflatten(treedef, results)


def allgather(tree):
    """Concatenate every leaf over processes along its leading axis, in rank order.

    A leaf of shape (n, ...) becomes (size * n, ...); a scalar becomes shape (size,). Stacked
    leaves keep their per-device rows, so the result is in global device order. Results are
    numpy arrays for numpy/Python inputs, and arrays on the first local device for jax inputs.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    kinds = [_classify(v, tree, i) for i, v in enumerate(leaves)]
    results = [None] * len(leaves)
    home = _home_device()
    seq = TRACKER.start("allgather")
    for on_device, wanted in ((True, DEVICE_KINDS), (False, HOST_KINDS)):
        indices = [i for i, k in enumerate(kinds) if k in wanted]
        for wire, members in _by_wire_dtype(leaves, indices):
            if on_device:
                gathered = _fused_allgather([jax.device_put(leaves[i], home).astype(wire) for i in members])
                TRACKER.dispatched(seq, "allgather", gathered[-1])
            else:
                buffer = np.ascontiguousarray(_host_concat([np.asarray(leaves[i], wire) for i in members]))
                out = np.empty((MPI.COMM_WORLD.Get_size(), buffer.size), buffer.dtype)
                TRACKER.enter(seq, "allgather")
                _host_comm().Allgather(buffer, out)
                TRACKER.leave()
                gathered = _split_columns(out, [np.shape(leaves[i]) for i in members])
            for i, value in zip(members, gathered):
                shape = np.shape(leaves[i])
                if shape:
                    value = value.reshape((-1,) + tuple(shape[1:]))
                results[i] = value.astype(_dtype_of(leaves[i]))
    TRACKER.done(seq)  # an empty tree sends nothing, and must not stay pending
    return jax.tree_util.tree_unflatten(treedef, results)


def wait_pending() -> None:
    """Block until every dispatched cross-process call has run. The fast path's calls carry no
    JAX effect, so jax.effects_barrier() alone does not wait for them; a process must not exit
    while one is still queued, or its peers would wait forever."""
    jax.effects_barrier()
    jax.block_until_ready(list(_dependency.values()))


def barrier() -> None:
    """Wait until every process gets here (pending cross-process calls finish first)."""
    wait_pending()
    seq = TRACKER.start("barrier")
    TRACKER.enter(seq, "barrier")
    _host_comm().Barrier()
    TRACKER.leave()
