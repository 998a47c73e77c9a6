"""Data-parallel training: every device of every process holds a different slice of the data;
gradients are averaged over all of them with launcher.allreduce, so every replica takes the
same step. The model is a linear regression, so the result can be checked exactly.

Preemption-safe: it checkpoints every `checkpoint_every` steps and whenever ctx.should_stop()
says a notice came (Slurm's time-limit warning, a preemption, SIGUSR2), and resumes from the
latest checkpoint. Losses are part of the checkpoint, so result.json's `losses` covers every
attempt, and a run that was stopped and resumed gives the same bits as one that was not."""

import time

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
    checkpoint_every = int(ctx.params.get("checkpoint_every", 25))
    step_seconds = float(ctx.params.get("step_seconds", 0.0))  # slows the job down, for preemption demos
    seed = int(ctx.params.get("seed", 0))  # the true model and the data
    # Fault injection, for trying out sweeps and restarts: a run whose params match every
    # key of `fail_when` raises at step 5 (e.g. fail_when: {seed: 2, learning_rate: 0.1}).
    fail_when = ctx.params.get("fail_when") or {}
    fails = bool(fail_when) and all(ctx.params.get(k) == v for k, v in fail_when.items())
    n = ctx.num_local_devices

    # The same true model everywhere; different data on every device of every process.
    true_w = np.random.default_rng(seed).normal(size=features).astype(np.float32)
    rng = np.random.default_rng([seed, 1 + ctx.rank])
    x = rng.normal(size=(n, per_device, features)).astype(np.float32)
    y = x @ true_w + 0.5 + 0.01 * rng.normal(size=(n, per_device)).astype(np.float32)

    params = {"w": jnp.zeros(features), "b": jnp.zeros(())}
    to_devices = jax.pmap(lambda a: a)  # row i of the leading axis onto local device i
    per_device_grads = jax.pmap(jax.value_and_grad(loss_fn), in_axes=(0, 0, 0))
    apply = jax.pmap(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g))

    # state = the replicated parameters (one row per local device) and the loss history.
    state = {"params": to_devices(jax.tree_util.tree_map(lambda a: jnp.stack([a] * n), params)),
             "losses": np.zeros(0, dtype=np.float64)}
    start = 0
    restored = ctx.checkpoints.restore(like=state)
    if restored is not None:
        start, state = restored
        ctx.logger.info("resumed from the checkpoint of step %d (attempt %d)", start, ctx.attempt)
    stacked_params, losses = state["params"], list(state["losses"])
    xs, ys = to_devices(x), to_devices(y)

    for step in range(start, steps):
        # Checked before each step, on every rank: they all stop at the same step.
        if ctx.should_stop():
            ctx.checkpoints.save(step, {"params": stacked_params, "losses": np.array(losses)})
            ctx.logger.info("checkpointed at step %d after a preemption notice; stopping", step)
            return None
        if fails and step == 5:
            raise RuntimeError(f"injected failure at step {step}: params match fail_when {fail_when}")
        step_losses, grads = per_device_grads(stacked_params, xs, ys)
        grads = launcher.allreduce(grads, op="mean")        # mean over every device of every process
        losses.append(float(launcher.allreduce(step_losses, op="mean")[0]))
        stacked_params = apply(stacked_params, grads)
        if step_seconds:
            time.sleep(step_seconds)
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
            "w_error": float(np.abs(final["w"] - true_w).max()), "b": float(final["b"]),
            "replicas_in_sync": bool(launcher.allreduce(np.array(in_sync), op="min")),
            "devices": ctx.size * n, "attempt": ctx.attempt,
            "config": {"learning_rate": lr, "seed": seed}}  # what this run trained with (sweeps check it)
