"""The cross-process step of the collectives' device path: mpi4jax's MPI_Allreduce, dispatched
cheaply. (Arrays on the first device of a CPU process do not come here: staged.py stages them
through host memory and mpi4py, which costs less still.)

Why this module exists (measured with py-spy and perf, jax 0.10.2, mpi4jax 0.9.1.post2, CPU):
a jitted `mpi4jax.allreduce` costs ~230-550 us per call even for 8 bytes and one rank, while the
MPI call inside it costs ~2 us. Nearly all of it is JAX's dispatch of a computation that carries
an *ordered effect* (mpi4jax attaches one to every op): such executables never get the C++ jit
fast path (`pjit._get_fastpath_data` returns None), so every call runs in Python and threads a
runtime token through `dispatch.RuntimeTokenSet.get_token_input`, which does a `device_put` per
call. A primitive with that effect that does nothing costs the same; mpi4jax's C++ handler and
libmpi are <1% of the profile. The cost also grows with the jit's argument count (100 leaves:
1.7 ms), so per-leaf calls are the worst case.

What we do instead: call the SAME mpi4jax FFI target (`mpi_allreduce_ffi`, registered when
mpi4jax is imported, so mpi4jax stays the transport) from a primitive WITHOUT the ordered effect.
The jit keeps the fast path (~10-20 us per call). What the effect provided is restored here:
- order: every call takes and returns a counter, so each call depends on the previous one, and
  a device runs its computations in order; ranks therefore pair the same calls;
- one MPI call per process: the lowering refuses computations spanning several devices;
- a communicator of our own, used by nothing else.
The custom call keeps has_side_effect=True, so XLA never drops it.

This uses mpi4jax internals (the FFI target's name and attributes). If they are not there (a
different mpi4jax), `FAST_PATH` is False and the public, ordered `mpi4jax.allreduce` is used, with
the same fusion, only slower. Set JAXLAUNCH_ORDERED_MPI4JAX=1 to force that path.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
from jax.interpreters import mlir

try:
    import mpi4jax
    MPI4JAX_MISSING = None
except ImportError as exc:  # a JAX release mpi4jax does not support yet: transport: xla still works
    mpi4jax = None
    MPI4JAX_MISSING = f"{type(exc).__name__}: {exc}"


def require_mpi4jax():
    """mpi4jax, or an error that says what works without it."""
    if mpi4jax is None:
        raise RuntimeError(f"mpi4jax cannot be imported ({MPI4JAX_MISSING}), and launcher's collectives need it for "
                           f"device arrays over MPI, and for every call inside jax.jit. Fix: install an mpi4jax "
                           f"built for this JAX and MPI (`jaxlaunch doctor` checks it), or run the job with "
                           f"jax_distributed: true and transport: xla (XLA's own collectives), calling the "
                           f"collectives outside jit")
    return mpi4jax


# mpi4jax's handler passes the element count to MPI as a C int.
MAX_COUNT = 2**31 - 1


def _build_fast_primitive():
    from jax._src.core import ShapedArray, abstract_token
    from jax._src.lib.mlir.dialects import hlo
    from jax._src import sharding_impls
    from jax.extend.core import Primitive
    from jax.ffi import ffi_lowering
    from mpi4jax._src.utils import to_dtype_handle, to_mpi_handle

    primitive = Primitive("jaxlaunch_allreduce")

    def abstract_eval(x, *, op, comm):
        return ShapedArray(x.shape, x.dtype)

    def lowering(ctx, x, *, op, comm):
        axis = ctx.module_context.axis_context
        if not (isinstance(axis, sharding_impls.ShardingContext) and axis.num_devices == 1):
            raise NotImplementedError(
                "launcher.allreduce inside a jit that spans several devices: the cross-process allreduce "
                "makes one MPI call per process, so it runs only in a single-device computation. Inside "
                "shard_map or pmap, reduce the local devices with jax.lax.psum and call launcher.allreduce "
                "outside, on the result; or run one device per process (devices_per_process: 1)")
        (aval,) = ctx.avals_in
        token = hlo.create_token()
        with_token = ctx.replace(avals_in=(aval, abstract_token), avals_out=(*ctx.avals_out, abstract_token))
        rule = ffi_lowering("mpi_allreduce_ffi", has_side_effect=True)
        results = list(rule(with_token, x, token, nitems=np.int64(int(np.prod(aval.shape, dtype=np.int64))),
                            op=np.int64(to_mpi_handle(op.obj)), comm=np.int64(to_mpi_handle(comm.obj)),
                            dtype=np.int64(to_dtype_handle(aval.dtype))))
        return results[:-1]  # drop the token

    primitive.def_abstract_eval(abstract_eval)
    mlir.register_lowering(primitive, lowering, platform="cpu")
    return primitive


class Static:
    """An MPI handle as a static jit parameter: hashable AND comparable (mpi4jax's wrapper has no
    __eq__, which makes JAX's caches miss and recompile on every eager call)."""

    __slots__ = ("obj", "handle")

    def __init__(self, obj):
        from mpi4py import MPI

        self.obj = obj
        self.handle = MPI._handleof(obj)

    def __hash__(self):
        return hash(self.handle)

    def __eq__(self, other):
        return isinstance(other, Static) and other.handle == self.handle


try:
    _FAST = None if os.environ.get("JAXLAUNCH_ORDERED_MPI4JAX") == "1" else _build_fast_primitive()
except (ImportError, AttributeError):  # mpi4jax missing, or its or JAX's internals moved: the public path
    _FAST = None
FAST_PATH = _FAST is not None


def named_axes() -> dict:
    """The named axes being traced over (pmap, shard_map, vmap(axis_name=...)): {} in a plain jit
    (traced.py refuses a collective there). JAX keeps them in an internal; if it moved, {} (a jit
    over several devices is still refused by the lowering below)."""
    try:
        from jax._src import core

        return dict(core.get_axis_env().axis_sizes)
    except (ImportError, AttributeError):
        return {}


def fast_path_for(device) -> bool:
    """The fast path is registered for CPU; other platforms use mpi4jax's public op (and its
    CUDA/XPU bridge, when mpi4jax was built with one)."""
    return FAST_PATH and device.platform == "cpu"


def allreduce_flat(buffer, op, comm, ordered: bool = False):
    """Allreduce a 1-D buffer inside a single-device jit. `op`, `comm`: mpi4py objects."""
    if buffer.shape[0] > MAX_COUNT:
        chunks = [buffer[i:i + MAX_COUNT] for i in range(0, buffer.shape[0], MAX_COUNT)]
        return jnp.concatenate([allreduce_flat(c, op, comm, ordered) for c in chunks])
    if _FAST is None or ordered:
        return require_mpi4jax().allreduce(buffer, op=op, comm=comm)
    return _FAST.bind(buffer, op=Static(op), comm=Static(comm))
