"""x / psum(x) over every device of every process.

Device d (in global order) holds d + 1. The local part of the sum runs inside pmap; the
cross-host part is launcher.allreduce (one mpi4jax call). With 2 processes x 2 devices the
result is [0.1, 0.2, 0.3, 0.4].
"""

import jax
import jax.numpy as jnp
import numpy as np

import launcher


def main(ctx: launcher.JobContext):
    n = ctx.num_local_devices
    first = ctx.global_device_offset
    # One value per local device, as pmap lays it out: shape (n,), row i on device i.
    x = jax.pmap(lambda i: i + 1.0)(jnp.arange(first, first + n, dtype=jnp.float32))
    total = launcher.allreduce(x)                  # every row: the sum over all devices
    normalized = jax.pmap(jnp.divide)(x, total)
    values = launcher.allgather(np.asarray(normalized))
    ctx.logger.info("local values %s, global sum %s", np.asarray(x).tolist(), float(total[0]))
    return {"values": values.tolist(), "devices": int(values.size), "processes": ctx.size}
