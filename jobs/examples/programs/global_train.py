"""A training script in the style of Flax/MaxText code: it starts JAX's runtime itself with
`jax.distributed.initialize()` (no arguments, as on a TPU pod or under srun), builds a mesh of
every process's devices, and trains a linear model data-parallel in one jit: XLA does the
cross-process reduction (gloo on CPU, NCCL on GPU). jaxlaunch answers the initialize call with
its own coordinator (global_train.yaml, or `jaxlaunch run global_train.py -n 2`)."""

import argparse
import json
import os

import jax

jax.distributed.initialize()  # before any other JAX call, as JAX requires

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--out", default=None, help="process 0 writes the final loss and weights here (JSON)")
args = parser.parse_args()

mesh = Mesh(np.array(jax.devices()), ("data",))
batch_per_device, features = 8, 4
rows = batch_per_device * jax.local_device_count()
# Each process makes its own shard of the global batch: y = x . true_w
rng = np.random.default_rng(jax.process_index())
true_w = np.arange(1, features + 1, dtype=np.float32)
x_local = rng.normal(size=(rows, features)).astype(np.float32)
x = multihost_utils.host_local_array_to_global_array(x_local, mesh, P("data"))
y = multihost_utils.host_local_array_to_global_array(x_local @ true_w, mesh, P("data"))
w = jax.device_put(jnp.zeros(features), NamedSharding(mesh, P()))


@jax.jit
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - args.lr * grad, loss  # the mean over the global batch: XLA's all-reduce across processes


for step in range(args.steps):
    w, loss = train_step(w, x, y)
final = {"processes": jax.process_count(), "devices": jax.device_count(), "loss": float(loss),
         "w": [float(v) for v in multihost_utils.process_allgather(w, tiled=True)]}
print(f"process {jax.process_index()} of {jax.process_count()}: loss {final['loss']:.6f}")
if jax.process_index() == 0 and args.out:
    with open(args.out + ".tmp", "w") as f:
        json.dump(final, f)
    os.replace(args.out + ".tmp", args.out)
