"""The staged path: the common tree (arrays on the first local device of a CPU process, NumPy
arrays, Python numbers) staged through host memory, by a plan cached per signature (each leaf's
kind, shape and dtype):
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

Of the paths, only this module uses JAX internals (`jax._src`: the array type, jaxlib's batched put
and its garbage collection), each import with a public fallback, so that a JAX release that moves
them costs speed, not correctness (transport.py, the device path's MPI step, needs them too: see its
doc). tests/unit/test_layout.py keeps them here.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding
from mpi4py import MPI

from ..tracker import TRACKER
from .host import host_comm, restore_host
from .leaves import MPI_OPS, WIRE_DTYPES, call_groups, home_device, result_dtype, wire_dtype


def _device_put(aval, sharding, values, devices, committed, copy):
    """jax.device_put with the signature of jaxlib's batched_device_put (used when that is missing)."""
    return jax.device_put(values[0], devices[0], may_alias=not copy)


try:  # the host-to-device put under jax.device_put, without its ~30 us of Python per array
    from jax._src.array import ArrayImpl
    from jax._src.lib import xla_client as _xla_client

    _put = _xla_client.batched_device_put
except (ImportError, AttributeError):  # JAX internals moved: jax.device_put does the same, slower
    ArrayImpl = jax.Array  # never a leaf's exact type: no device leaf is staged then
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
    return SingleDeviceSharding(home_device())


@functools.cache
def _home_devices():
    return [home_device()]


@functools.cache
def _home_is_cpu() -> bool:
    return home_device().platform == "cpu"


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
    return dtype.kind in "biufc" or dtype.name in WIRE_DTYPES


def staged_signature(leaves):
    """(kind, shape, dtype) per leaf when every leaf can be staged through host memory: a jax.Array
    on the home device of a CPU process, a NumPy array or scalar, a Python number. None otherwise."""
    if not (STAGED and _home_is_cpu()):
        return None
    signature = []
    for leaf in leaves:
        cls = type(leaf)
        if cls is ArrayImpl:
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
def allreduce_plan(signature, op):
    """The groups of call_groups (the same calls in the same order on every rank), laid out."""
    groups = []
    for members in call_groups([(shape, dtype) for _, shape, dtype in signature], op):
        staged, start = [], 0
        for i in members:
            kind, shape, dtype = signature[i]
            stop = start + math.prod(shape)
            staged.append(_staged_leaf(i, kind, shape, dtype, start, stop, result_dtype(dtype, op)))
            start = stop
        groups.append(_staged_group(wire_dtype(signature[members[0]][2], op), start, staged, op))
    return tuple(groups)


@functools.lru_cache(maxsize=256)
def broadcast_plan(signature):
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
    launchers/rank_start.py: RANK_ENV_DEFAULTS; this holds without them too (a spec whose env sets GLIBC_TUNABLES for
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
        comm = host_comm()
        for send, receive in pairs:
            comm.Allreduce(send, receive, op=MPI_OPS[op])
    finally:
        TRACKER.leave()
    return comm.Get_size()


def _bcast_tracked(buffer, root) -> None:
    """One launcher broadcast's MPI call, on the buffer's bytes (MPI has no type for bfloat16)."""
    seq = TRACKER.start("broadcast")
    TRACKER.enter(seq, "broadcast")
    try:
        host_comm().Bcast(buffer.reshape(-1).view(np.uint8), root=root)
    finally:
        TRACKER.leave()


def allreduce_staged(leaves, groups, op):
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
            results[leaf.index] = restore_host(value if fresh else value.copy(), leaves[leaf.index], leaf.kind)


@functools.lru_cache(maxsize=256)
def _result_aval(shape, dtype):
    return jax.core.ShapedArray(shape, dtype)


def allreduce_one_array(x, op):
    """launcher.allreduce(x) of one array on the home device that comes back in its own dtype: the
    commonest call (a loss, a count, a packed gradient buffer), as the staged path makes it, without
    the tree machinery around it (~10 us of Python). None when x is not such an array."""
    dtype = x.dtype
    if not (STAGED and dtype.kind in ("fc" if op == "mean" else "iufc") and dtype.name not in WIRE_DTYPES
            and _home_is_cpu() and _is_home_sharding(x.sharding)):
        return None  # float16 travels as float32, as in a tree: that is the general path's work
    send = np.asarray(x)  # waits until x is computed: before the tracker
    buffer = _buffer(send.shape, dtype)
    processes = _allreduce_tracked([(send, buffer)], op)
    if op == "mean":
        np.divide(buffer, processes, out=buffer)
    return _put(_result_aval(send.shape, dtype), _home_sharding(), [buffer], _home_devices(), True, False)


def broadcast_one_array(x, root):
    """launcher.broadcast(x) of one array on the home device, as the staged path makes it, without the
    tree machinery. None when x is not such an array."""
    if not (STAGED and _home_is_cpu() and _is_home_sharding(x.sharding)):
        return None
    buffer = _buffer(x.shape, x.dtype)
    if MPI.COMM_WORLD.Get_rank() == root:  # elsewhere the value is overwritten: no need to read (or wait for) it
        buffer[...] = np.asarray(x)
    _bcast_tracked(buffer, root)
    return _put(_result_aval(x.shape, x.dtype), _home_sharding(), [buffer], _home_devices(), True, False)


def broadcast_staged(leaves, group, root):
    # elsewhere than at the root the values are overwritten: no need to read (or wait for) them
    buffer = _gather(leaves, group) if MPI.COMM_WORLD.Get_rank() == root else _empty(group)
    _bcast_tracked(buffer, root)
    sharding, devices = _home_sharding(), _home_devices()
    if len(group.leaves) == 1:
        leaf = group.leaves[0]
        if leaf.aval is None:
            return [restore_host(buffer, leaves[0], leaf.kind)]
        return [_put(leaf.aval, sharding, [buffer], devices, True, False)]
    results = []
    for leaf in group.leaves:
        value = buffer[leaf.start:leaf.stop].view(leaf.dtype).reshape(leaf.shape)
        if leaf.aval is None:
            results.append(restore_host(value.copy(), leaves[leaf.index], leaf.kind))
        else:
            results.append(_put(leaf.aval, sharding, [value], devices, True, True))
    return results
