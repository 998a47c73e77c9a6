"""A copy of jobs/examples/train_data_parallel.py's loop as a careless team writes it: the same data-parallel
step and reports, but it never checkpoints and never asks ctx.should_stop(). `jaxlaunch drill` must
fail it (tests/e2e/test_drill.py): a preemption notice is ignored, a killed rank costs every step."""

import time

import numpy as np

import launcher


def main(ctx):
    steps, lr = int(ctx.params.get("steps", 40)), float(ctx.params.get("learning_rate", 0.1))
    rng = np.random.default_rng([0, ctx.rank])
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = x @ np.arange(1.0, 5.0, dtype=np.float32)
    w = np.zeros(4, np.float32)
    losses = []
    for step in range(steps):
        error = x @ w - y
        grad = np.asarray(launcher.allreduce(2 * x.T @ error / len(x))) / ctx.size
        w = w - lr * grad
        losses.append(float(launcher.allreduce(np.float32(np.mean(error ** 2)))) / ctx.size)
        ctx.report(step, total=steps, loss=losses[-1])
        time.sleep(float(ctx.params.get("step_seconds", 0.05)))
    return {"losses": losses, "w": w.tolist()}
