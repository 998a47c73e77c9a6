"""Data-parallel training of a small MLP, the same mathematics on any layout.

The dataset and the global batch are fixed by `seed` alone. Each device takes the slice of the
global batch that its global device index names (rank-major: process 0's devices first), so
1 process x 1 device, 1 x 2, 2 x 1 and 2 x 2 all compute the same step: the mean loss over the
same global batch, its gradient (a pytree of weights and biases) averaged over every device of
every process with launcher.allreduce. Only floating-point summation order differs by layout.

Preemption-safe: it checkpoints every `checkpoint_every` steps and whenever ctx.should_stop()
says a notice came (Slurm's time-limit warning, a preemption, SIGUSR2), and resumes from the
latest checkpoint. Losses are part of the checkpoint, so result.json's `losses` covers every
attempt, and a run that was stopped and resumed gives the same bits as one that was not.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import launcher


def init_params(seed: int, sizes: list[int]) -> dict:
    """Flat names (w0, b0, w1, b1, ...) so result.json keeps them as plain arrays."""
    rng = np.random.default_rng([seed, 7])
    params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{layer}"] = (rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        params[f"b{layer}"] = np.zeros(fan_out, np.float32)
    return params


def global_dataset(seed: int, examples: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole training set, the same on every process: y = sin(x . v) + 0.5, plus noise."""
    rng = np.random.default_rng([seed, 1])
    x = rng.normal(size=(examples, features)).astype(np.float32)
    v = rng.normal(size=features).astype(np.float32) / np.sqrt(features)
    y = (np.sin(x @ v) + 0.5 + 0.05 * rng.normal(size=examples)).astype(np.float32)
    return x, y[:, None]


def forward(params, x):
    layers = len(params) // 2
    h = x
    for layer in range(layers):
        h = h @ params[f"w{layer}"] + params[f"b{layer}"]
        if layer < layers - 1:
            h = jnp.tanh(h)
    return h


def loss_fn(params, x, y):
    return jnp.mean((forward(params, x) - y) ** 2)


def main(ctx: launcher.JobContext):
    steps = int(ctx.params.get("steps", 100))
    lr = float(ctx.params.get("learning_rate", 0.1))
    global_batch = int(ctx.params.get("global_batch", 256))
    features = int(ctx.params.get("features", 8))
    hidden = list(ctx.params.get("hidden", [32, 32]))
    checkpoint_every = int(ctx.params.get("checkpoint_every", 25))
    step_seconds = float(ctx.params.get("step_seconds", 0.0))  # slows the job down, for preemption demos
    # One slow rank (a throttled GPU, a noisy neighbour), for the slow-rank report: it sleeps this much
    # more per step, before its gradients.
    slow_rank, slow_seconds = int(ctx.params.get("slow_rank", -1)), float(ctx.params.get("slow_seconds", 0.0))
    seed = int(ctx.params.get("seed", 0))  # the dataset and the initial parameters
    # Fault injection, for trying out sweeps and restarts: a run whose params match every
    # key of `fail_when` raises at step 5 (e.g. fail_when: {seed: 2, learning_rate: 0.1}).
    fail_when = ctx.params.get("fail_when") or {}
    fails = bool(fail_when) and all(ctx.params.get(k) == v for k, v in fail_when.items())
    # A crash at a known step (the goodput test): rank fail_rank raises before step fail_step in the
    # first attempt, after fail_delay seconds.
    fail_rank, fail_step = int(ctx.params.get("fail_rank", -1)), int(ctx.params.get("fail_step", -1))

    n = ctx.num_local_devices
    total_devices = ctx.size * n
    if global_batch % total_devices:
        raise ValueError(f"params.global_batch={global_batch} does not split evenly over {total_devices} devices "
                         f"({ctx.size} processes x {n}); choose a multiple of {total_devices}")
    per_device = global_batch // total_devices
    x_all, y_all = global_dataset(seed, global_batch, features)
    # This process's devices take global device indices offset .. offset + n - 1.
    first = ctx.global_device_offset * per_device
    x = x_all[first:first + n * per_device].reshape(n, per_device, features)
    y = y_all[first:first + n * per_device].reshape(n, per_device, 1)

    params = init_params(seed, [features, *hidden, 1])
    # The gradient tree travels as ONE buffer: packed inside the gradient step's pmap, unpacked
    # inside the update's, so the exchange between them is a single allreduce call.
    packer = launcher.TreePacker(params)

    def grad_step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return loss, packer.pack(grads)

    def update(p, flat):
        return jax.tree_util.tree_map(lambda a, g: a - lr * g, p, packer.unpack(flat))

    to_devices = jax.pmap(lambda a: a)  # row i of the leading axis onto local device i
    per_device_grads = jax.pmap(grad_step)
    apply = jax.pmap(update)

    # state = the replicated parameters (one row per local device) and the loss history.
    state = {"params": to_devices(jax.tree_util.tree_map(lambda a: np.stack([a] * n), params)),
             "losses": np.zeros(0, dtype=np.float64)}
    start = 0
    restored = ctx.checkpoints.restore(like=state)
    if restored is not None:
        start, state = restored
        ctx.logger.info("resumed from the checkpoint of step %d (attempt %d)", start, ctx.attempt)
    stacked_params, losses = state["params"], state["losses"].tolist()  # Python floats, as float() gives below
    xs, ys = to_devices(x), to_devices(y)

    for step in range(start, steps):
        # Checked before each step, on every rank: they all stop at the same step.
        if ctx.should_stop():
            ctx.checkpoints.save(step, {"params": stacked_params, "losses": np.array(losses)})
            ctx.logger.info("checkpointed at step %d after a preemption notice; stopping", step)
            return None
        if fails and step == 5:
            raise RuntimeError(f"injected failure at step {step}: params match fail_when {fail_when}")
        if ctx.rank == fail_rank and step == fail_step and ctx.attempt == 0:
            time.sleep(float(ctx.params.get("fail_delay", 0.0)))
            raise RuntimeError(f"injected failure at step {step} on rank {ctx.rank}")
        if ctx.rank == slow_rank:
            time.sleep(slow_seconds)
        step_losses, grads = per_device_grads(stacked_params, xs, ys)
        # The mean over every device of every process: the gradient of the global batch's mean loss.
        grads = launcher.allreduce(grads, op="mean")  # one packed buffer per device
        losses.append(float(launcher.allreduce(step_losses, op="mean")[0]))
        stacked_params = apply(stacked_params, grads)
        if step_seconds:
            time.sleep(step_seconds)
        ctx.report(step, total=steps, loss=losses[-1])  # jaxlaunch status: step, rate, ETA, loss
        if step % 20 == 0 or step == steps - 1:
            ctx.logger.info("step %d loss %.6f", step, losses[-1])
        if checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
            ctx.checkpoints.save(step + 1, {"params": stacked_params, "losses": np.array(losses)})

    final = jax.tree_util.tree_map(lambda a: np.asarray(a[0]), stacked_params)
    # Every replica must hold the same parameters: compare against rank 0's.
    reference = launcher.broadcast(final, root=0)
    in_sync = all(np.array_equal(final[k], reference[k]) for k in final)
    return {"first_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "params": {k: np.asarray(v) for k, v in final.items()},
            "replicas_in_sync": bool(launcher.allreduce(np.array(in_sync), op="min")),
            "devices": total_devices, "attempt": ctx.attempt,
            "config": {"learning_rate": lr, "seed": seed}}  # what this run trained with (sweeps check it)
