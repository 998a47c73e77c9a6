"""How a leaf is read and how it travels: its kind, the dtype it goes over the wire as and comes
back as, and which leaves share one MPI call. Pure bookkeeping, the same on every rank, shared by
every path (staged.py, device.py, host.py) and by the public operations (ops.py). The home device,
the first local one, is where the common case lives and where the device path makes its MPI calls.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding
from mpi4py import MPI

MPI_OPS = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
# dtypes MPI has no type for travel as float32 and are cast back.
WIRE_DTYPES = {"bfloat16": np.dtype(np.float32), "float16": np.dtype(np.float32)}
# Leaves this large get an MPI call of their own: a 16 MiB concat + split costs more than a call.
SOLO_BYTES = 4 << 20

DEVICE_KINDS = ("home", "jax", "stacked")
HOST_KINDS = ("numpy", "python")


@functools.cache
def home_device():
    return jax.local_devices()[0]


def _leaf_name(tree, index: int) -> str:
    """`tree['a'][0]`-style name of a leaf, computed only for error messages."""
    path, _ = jax.tree_util.tree_flatten_with_path(tree)[0][index]
    return "tree" + jax.tree_util.keystr(path)


def classify(value, tree, index, home=None) -> str:
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
            return "home" if home is not None and is_on(sharding, home) else "jax"
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


def is_on(sharding, device) -> bool:
    return isinstance(sharding, SingleDeviceSharding) and next(iter(sharding.device_set)) == device


def wire_dtype(dtype, op: str | None = None) -> np.dtype:
    """The dtype a leaf travels as: bools as integers (a sum counts; max/min is any/all), and
    dtypes MPI lacks (float16, bfloat16) as float32."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_ and op is not None:
        return np.dtype(np.int32 if op in ("sum", "mean") else np.uint8)
    return WIRE_DTYPES.get(dtype.name, dtype)


def result_dtype(dtype, op: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if op == "mean":  # bfloat16 is no NumPy inexact type, yet a float: its mean stays bfloat16
        return dtype if np.issubdtype(dtype, np.inexact) or dtype.name in WIRE_DTYPES else np.dtype(np.float32)
    if dtype == np.bool_ and op == "sum":
        return np.dtype(np.int32)  # a sum of bools is a count
    return dtype


def call_groups(shapes_dtypes, op):
    """Leaf indices per MPI call: leaves of SOLO_BYTES or more alone, the rest one group per wire
    dtype. Deterministic, so every rank makes the same calls in the same order."""
    solo, by_dtype = [], {}
    for i, (shape, dtype) in enumerate(shapes_dtypes):
        wire = wire_dtype(dtype, op)
        if math.prod(shape) * wire.itemsize >= SOLO_BYTES:
            solo.append([i])
        else:
            by_dtype.setdefault(wire.name, []).append(i)
    return solo + [by_dtype[name] for name in sorted(by_dtype)]


def dtype_of(value) -> np.dtype:
    return np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype


def by_wire_dtype(leaves, indices):
    """[(wire dtype name, leaf indices)] in a fixed order, the same on every rank."""
    groups = {}
    for i in indices:
        groups.setdefault(wire_dtype(dtype_of(leaves[i])).name, []).append(i)
    return sorted(groups.items())



def split(flat, shapes):
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[start:start + n].reshape(shape))
        start += n
    return out


def concat(parts):
    flat = [jnp.ravel(p) for p in parts]
    return flat[0] if len(flat) == 1 else jnp.concatenate(flat)




def split_columns(gathered, shapes):
    """(size, n) -> one (size, *shape) block per leaf."""
    out, start = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(gathered[:, start:start + n].reshape((gathered.shape[0],) + tuple(shape)))
        start += n
    return out
