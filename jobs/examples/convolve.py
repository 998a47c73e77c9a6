"""A batched 1-D convolution: vmap over the batch, jit, then pmap over local devices.

Each process takes its share of the batch, splits it over its devices with pmap, and the
rows are gathered back in order. With x = arange(5) and w = [2, 3, 4] every row is
[11, 20, 29]; params.row_offset adds b * row_offset to row b, so gather order is visible.
"""

import jax
import jax.numpy as jnp
import numpy as np

import launcher


def convolve(x, w):
    """The 'valid' sliding dot product of x with w (JAX's vmap tutorial)."""
    return jnp.array([jnp.dot(x[i - 1:i + 2], w) for i in range(1, len(x) - 1)])


def main(ctx: launcher.JobContext):
    batch = int(ctx.params.get("batch", 8))
    offset = float(ctx.params.get("row_offset", 0))
    devices = ctx.size * ctx.num_local_devices
    if batch % devices:
        raise ValueError(f"params.batch={batch} must be a multiple of the {devices} devices")
    xs = np.arange(5, dtype=np.float32)[None, :] + offset * np.arange(batch, dtype=np.float32)[:, None]
    w = jnp.array([2.0, 3.0, 4.0])

    mine = xs.reshape(ctx.size, -1, 5)[ctx.rank]                 # this process's rows
    per_device = mine.reshape(ctx.num_local_devices, -1, 5)       # (devices, rows per device, 5)
    batched = jax.jit(jax.vmap(convolve, in_axes=(0, None)))
    out = jax.pmap(batched, in_axes=(0, None))(per_device, w)      # (devices, rows, 3)
    rows = launcher.allgather(np.asarray(out).reshape(-1, 3))      # (batch, 3), in batch order
    return {"values": rows.tolist()}
