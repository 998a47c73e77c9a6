"""Model parallel inside each process, data parallel across processes.

A two-layer MLP whose weights are split over the local devices (ctx.mesh): W1 by columns and W2
by rows, so each device holds half of the hidden layer and XLA adds the reduction between them.
Each process trains on its own batch; launcher.allreduce averages the sharded gradients over
processes and they keep their sharding. Returns the final weights (result.npz) and the losses.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import launcher
from launcher import DEVICE_AXIS


def init(features, hidden, outputs):
    rng = np.random.default_rng(0)  # the same initial weights on every process
    return {"w1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32),
            "w2": (rng.standard_normal((hidden, outputs)) / np.sqrt(hidden)).astype(np.float32)}


def batch(rank, examples, features, outputs):
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((examples, features)).astype(np.float32)
    return x, np.sin(x[:, :outputs]).astype(np.float32)


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def main(ctx: launcher.JobContext):
    features, hidden, outputs = (int(ctx.params.get(k, d)) for k, d in
                                 (("features", 16), ("hidden", 32), ("outputs", 4)))
    steps, lr = int(ctx.params.get("steps", 20)), float(ctx.params.get("learning_rate", 0.2))
    shardings = {"w1": NamedSharding(ctx.mesh, PartitionSpec(None, DEVICE_AXIS)),
                 "w2": NamedSharding(ctx.mesh, PartitionSpec(DEVICE_AXIS, None))}
    params = {k: jax.device_put(v, shardings[k]) for k, v in init(features, hidden, outputs).items()}
    x, y = batch(ctx.rank, int(ctx.params.get("examples", 64)), features, outputs)
    replicated = NamedSharding(ctx.mesh, PartitionSpec())
    x, y = jax.device_put(x, replicated), jax.device_put(y, replicated)

    grad_step = jax.jit(jax.value_and_grad(loss_fn))
    update = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), out_shardings=shardings)
    losses = []
    for step in range(steps):
        loss, grads = grad_step(params, x, y)
        grads = launcher.allreduce(grads, op="mean")   # sharded over local devices, averaged over processes
        losses.append(float(launcher.allreduce(np.float32(loss), op="mean")))
        params = update(params, grads)
        ctx.report(step, total=steps, loss=losses[-1])
    assert params["w1"].sharding == shardings["w1"], "the update must keep the model-parallel layout"
    ctx.logger.info("loss %.5f -> %.5f", losses[0], losses[-1])
    return {"losses": losses, "w1": np.asarray(params["w1"]), "w2": np.asarray(params["w2"])}
