"""Model parallel ACROSS processes: one jit over a mesh of every device of every process.

With `jax_distributed: true` the processes form one JAX runtime, so `jax.devices()` lists every
device of every host. The MLP of jobs/examples/sharded_mlp.py is split over ALL of them (W1 by columns, W2
by rows: each device holds hidden/devices units) and trained on one global batch, replicated;
XLA inserts the cross-host reduction itself (gloo on CPU, NCCL on GPU). No launcher collective
is involved. The result must equal plain NumPy backprop on one machine (jobs/examples/sharded_mlp.py's
`init` and the global batch), which rank 0 checks before returning. Preemption-safe: the sharded
weights are checkpointed as they lie and restored onto the mesh of the run that resumes.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import launcher

AXIS = "model"


def init(features, hidden, outputs):
    rng = np.random.default_rng(0)
    return {"w1": (rng.standard_normal((features, hidden)) / np.sqrt(features)).astype(np.float32),
            "w2": (rng.standard_normal((hidden, outputs)) / np.sqrt(hidden)).astype(np.float32)}


def global_batch(examples, features, outputs):
    rng = np.random.default_rng(100)
    x = rng.standard_normal((examples, features)).astype(np.float32)
    return x, np.sin(x[:, :outputs]).astype(np.float32)


def loss_fn(params, x, y):
    return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)


def numpy_reference(params, x, y, steps, lr):
    """The same training in float64 NumPy, on one machine."""
    params = {k: v.astype(np.float64) for k, v in params.items()}
    x, y = x.astype(np.float64), y.astype(np.float64)
    losses = []
    for _ in range(steps):
        h = np.tanh(x @ params["w1"])
        error = h @ params["w2"] - y
        losses.append(float(np.mean(error ** 2)))
        d_out = 2 * error / error.size
        grads = {"w2": h.T @ d_out, "w1": x.T @ ((d_out @ params["w2"].T) * (1 - h ** 2))}
        params = {k: params[k] - lr * grads[k] for k in params}
    return losses, params


def put_global(value, sharding):
    """A global array from the same NumPy value on every process: each takes its own shards."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def main(ctx: launcher.JobContext):
    if jax.process_count() != ctx.size:
        raise RuntimeError("global_mesh needs `jax_distributed: true` in the spec (one JAX runtime over all "
                           f"processes); jax.process_count() is {jax.process_count()}, the job has {ctx.size}")
    features, hidden, outputs, examples = (int(ctx.params.get(k, d)) for k, d in
                                           (("features", 16), ("hidden", 32), ("outputs", 4), ("examples", 128)))
    steps, lr = int(ctx.params.get("steps", 20)), float(ctx.params.get("learning_rate", 0.2))
    checkpoint_every = int(ctx.params.get("checkpoint_every", 10))
    step_seconds = float(ctx.params.get("step_seconds", 0.0))  # slows the job down, for preemption demos
    mesh = Mesh(np.array(jax.devices()), (AXIS,))  # every device of every process
    if hidden % mesh.size:
        raise ValueError(f"params.hidden={hidden} must split evenly over the {mesh.size} devices of the global mesh")
    shardings = {"w1": NamedSharding(mesh, PartitionSpec(None, AXIS)),
                 "w2": NamedSharding(mesh, PartitionSpec(AXIS, None))}
    replicated = NamedSharding(mesh, PartitionSpec())
    start = init(features, hidden, outputs)
    x_np, y_np = global_batch(examples, features, outputs)
    params = {k: put_global(v, shardings[k]) for k, v in start.items()}
    x, y = put_global(x_np, replicated), put_global(y_np, replicated)

    grad_step = jax.jit(jax.value_and_grad(loss_fn))
    update = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g), out_shardings=shardings)
    # Preemption-safe: the sharded weights are checkpointed as they lie, each process writing the
    # shards it owns, and restored onto this run's mesh (which may differ from the saving run's).
    first_step, losses = 0, []
    restored = ctx.checkpoints.restore(like={"params": params, "losses": np.zeros(0)})
    if restored is not None:
        first_step, state = restored
        params, losses = state["params"], [float(v) for v in state["losses"]]
    for step in range(first_step, steps):
        if ctx.should_stop():                   # a preemption notice reached some rank: all stop here
            ctx.checkpoints.save(step, {"params": params, "losses": np.array(losses)})
            return None
        loss, grads = grad_step(params, x, y)   # XLA's own collectives across the hosts
        losses.append(float(loss))              # replicated: every process holds the global loss
        params = update(params, grads)
        ctx.report(step, total=steps, loss=losses[-1])
        if step_seconds:
            time.sleep(step_seconds)
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            ctx.checkpoints.save(step + 1, {"params": params, "losses": np.array(losses)})  # in the background
    local_shard = params["w1"].addressable_shards[0].data.shape
    final = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True)) for k, v in params.items()}

    reference_losses, reference = numpy_reference(start, x_np, y_np, steps, lr)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)
    for name in final:
        np.testing.assert_allclose(final[name], reference[name], rtol=1e-4, atol=1e-5, err_msg=name)
    ctx.logger.info("global mesh of %d devices over %d processes; loss %.5f -> %.5f; matches NumPy",
                    mesh.size, jax.process_count(), losses[0], losses[-1])
    return {"losses": losses, "w1": final["w1"], "w2": final["w2"], "global_devices": mesh.size,
            "processes": jax.process_count(), "w1_shard_shape": list(local_shard), "matches_numpy": True,
            "attempt": ctx.attempt}
