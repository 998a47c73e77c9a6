"""The XLA transport (spec `transport: xla`): the device leaves of allreduce, broadcast and allgather
cross processes as XLA's own collectives (gloo on CPU, NCCL on GPU) over a mesh of each process's
home device, the first local one, instead of mpi4jax. Needs JAX's multi-process runtime
(jax_distributed: true): the mesh spans every process.

The same tree rules as the MPI path (leaves.py): per-device rows are first reduced over the local
devices (device.py), the leaves of each wire dtype go as one buffer, half precision as float32,
bools as integers, a mean divides after the sum. Three dispatches per call: one jit on the home
device packs the buffers, one jit over the mesh exchanges them all (one XLA collective each), one
jit on the home device splits and casts. XLA runs a device's computations in order, so every
process pairs the same collectives, as the MPI path's counter does for mpi4jax.

Inside the job's own jit on one device there is no mesh of processes: an exchange there goes over
mpi4jax whatever the transport (traced.py). A step written for XLA's collectives is one jit over
the global mesh, with jax.lax.psum inside shard_map (docs/collectives.md, Transports).
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from mpi4py import MPI

from .leaves import call_groups, concat, home_device, result_dtype, split, split_columns, wire_dtype

AXIS = "processes"
LAST: list = []  # the latest exchange's result: a process must not exit while it is queued (ops.wait_pending)
_REDUCERS = {"sum": jax.lax.psum, "mean": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


@functools.cache
def mesh() -> Mesh:
    """One device per process, the home device of each, in process order (= MPI rank order)."""
    size, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    if jax.process_count() != size or jax.process_index() != rank:
        raise RuntimeError(
            f"transport: xla runs XLA's collectives over JAX's multi-process runtime, and JAX sees "
            f"{jax.process_count()} process(es) (this one {jax.process_index()}) where MPI has {size} (this one "
            f"{rank}). Fix: set jax_distributed: true in the spec (or call jax.distributed.initialize() before the "
            f"first collective), or use transport: mpi4jax")
    homes = {}
    for device in jax.devices():
        homes.setdefault(device.process_index, device)
    if homes[rank] != home_device():  # jax.devices() lists each process's devices as local_devices() does
        raise RuntimeError(f"transport: xla: JAX lists {homes[rank]} first for this process, not its first local "
                           f"device {home_device()}")
    return Mesh(np.array([homes[p] for p in range(size)]), (AXIS,))


def _sharded():
    return NamedSharding(mesh(), PartitionSpec(AXIS))


def _global(rows):
    """This process's (1, n) rows -> global (processes, n) arrays, one row per process."""
    size = mesh().devices.size
    sharding = _sharded()
    return [jax.make_array_from_single_device_arrays((size,) + row.shape[1:], sharding, [row]) for row in rows]


def _local(arrays):
    return [array.addressable_shards[0].data for array in arrays]


@functools.partial(jax.jit, static_argnames=("layout", "op"))
def _pack(parts, layout, op):
    return [concat([parts[i].astype(wire_dtype(parts[i].dtype, op)) for i in group])[None] for group in layout]


def _to_home(function, static_argnames):
    """A jit whose results are on the home device, like the MPI path's (with one process, a shard of
    a mesh array is that array, and would keep the mesh's sharding)."""
    jitted = {}

    def call(*args, **static):
        if not jitted:
            jitted[0] = jax.jit(function, static_argnames=static_argnames,
                                out_shardings=SingleDeviceSharding(home_device()))
        return jitted[0](*args, **static)
    return call


def _unpack(rows, meta, layout, op, counts):
    """rows: the reduced (1, n) buffers; meta: (shape, dtype name) per part."""
    out = [None] * len(meta)
    for row, group in zip(rows, layout):
        for i, value in zip(group, split(row[0], [meta[i][0] for i in group])):
            value = value / counts[i] if op == "mean" else value
            out[i] = value.astype(result_dtype(meta[i][1], op))
    return out


_unpack = _to_home(_unpack, ("meta", "layout", "op", "counts"))


@functools.cache
def _exchange(op: str, buffers: int):
    reduce = _REDUCERS[op]
    spec = PartitionSpec(AXIS)
    specs = (spec,) * buffers
    return jax.jit(jax.shard_map(lambda *xs: [reduce(x, AXIS) for x in xs], mesh=mesh(), in_specs=specs,
                                 out_specs=list(specs)))


def allreduce(parts, op: str, counts: tuple):
    """parts: arrays on the home device -> their reductions over processes, on the home device."""
    layout = tuple(tuple(group) for group in call_groups([(p.shape, p.dtype) for p in parts], op))
    rows = _pack(parts, layout=layout, op=op)
    reduced = _local(_exchange(op, len(rows))(*_global(rows)))
    LAST[:] = reduced[-1:]
    meta = tuple((p.shape, p.dtype.name) for p in parts)
    return _unpack(reduced, meta=meta, layout=layout, op=op, counts=counts)


@functools.cache
def _replicate(root: int | None):
    """A jit over the mesh whose results every process holds whole: the root's row (broadcast) or
    every row (allgather)."""
    pick = (lambda g: g) if root is None else (lambda g: g[root])
    return jax.jit(lambda rows: [pick(g) for g in rows], out_shardings=NamedSharding(mesh(), PartitionSpec()))


@jax.jit
def _pack_one(parts):
    return concat(parts)[None]


_split_row = _to_home(lambda row, shapes: split(row, shapes), ("shapes",))
_split_rows = _to_home(lambda rows, shapes: split_columns(rows, shapes), ("shapes",))


def broadcast(parts, root: int):
    """parts of one wire dtype, on the home device -> the root process's, split the same way."""
    got = LAST[:] = _local(_replicate(root)(_global([_pack_one(parts)])))
    got = got[0]
    return _split_row(got, shapes=tuple(p.shape for p in parts))


def allgather(parts):
    """parts of one wire dtype, on the home device -> one (processes, *shape) array per part."""
    got = LAST[:] = _local(_replicate(None)(_global([_pack_one(parts)])))
    got = got[0]
    return _split_rows(got, shapes=tuple(p.shape for p in parts))
