"""Data-parallel training: every device of every process holds a different slice of the data;
gradients are averaged over all of them with launcher.allreduce, so every replica takes the
same step. The model is a linear regression, so the result can be checked exactly."""

import jax
import jax.numpy as jnp
import numpy as np

import launcher


def loss_fn(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def main(ctx: launcher.JobContext):
    steps = int(ctx.params.get("steps", 100))
    lr = float(ctx.params.get("learning_rate", 0.1))
    per_device = int(ctx.params.get("examples_per_device", 64))
    features = int(ctx.params.get("features", 8))
    n = ctx.num_local_devices

    # The same true model everywhere; different data on every device of every process.
    true_w = np.random.default_rng(0).normal(size=features).astype(np.float32)
    rng = np.random.default_rng(1 + ctx.rank)
    x = rng.normal(size=(n, per_device, features)).astype(np.float32)
    y = x @ true_w + 0.5 + 0.01 * rng.normal(size=(n, per_device)).astype(np.float32)

    params = {"w": jnp.zeros(features), "b": jnp.zeros(())}
    to_devices = jax.pmap(lambda a: a)  # row i of the leading axis onto local device i
    per_device_grads = jax.pmap(jax.value_and_grad(loss_fn), in_axes=(0, 0, 0))
    apply = jax.pmap(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g))

    stacked_params = to_devices(jax.tree_util.tree_map(lambda a: jnp.stack([a] * n), params))
    xs, ys = to_devices(x), to_devices(y)
    first_loss = None
    for step in range(steps):
        losses, grads = per_device_grads(stacked_params, xs, ys)
        grads = launcher.allreduce(grads, op="mean")        # mean over every device of every process
        loss = float(launcher.allreduce(losses, op="mean")[0])
        first_loss = loss if first_loss is None else first_loss
        stacked_params = apply(stacked_params, grads)
        if step % 20 == 0 or step == steps - 1:
            ctx.logger.info("step %d loss %.6f", step, loss)

    final = jax.tree_util.tree_map(lambda a: np.asarray(a[0]), stacked_params)
    # Every replica must hold the same parameters: compare against rank 0's.
    reference = launcher.broadcast(final, root=0)
    in_sync = all(np.array_equal(final[k], reference[k]) for k in final)
    return {"first_loss": first_loss, "final_loss": loss, "w_error": float(np.abs(final["w"] - true_w).max()),
            "b": float(final["b"]), "replicas_in_sync": bool(launcher.allreduce(np.array(in_sync), op="min")),
            "devices": ctx.size * n}
