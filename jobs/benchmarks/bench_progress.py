"""What progress reports and the slow-rank tracking cost a training step, side by side in one run:
a data-parallel step of about params.step_ms (a jitted matmul chain, a gradient allreduce of
params.grad_floats floats and a loss allreduce read back as a float, as jobs/examples/train_data_parallel.py
does), timed in interleaved blocks with and without ctx.report and with and without the tracker's
arrival times (launcher/stragglers.py), median per step; and ctx.report alone per call.

    jaxlaunch run jobs/benchmarks/bench_progress.yaml
"""

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import launcher
from launcher.rank import tracker as tracker_module

ORIGINAL_START = tracker_module.CollectiveTracker.start


def start_without_arrivals(self, name):
    """The tracker's start() as it was before arrival times: a counter and the name."""
    self.count += 1
    self.names[self.count % self.NAMES] = name
    return self.count


def main(ctx):
    size, depth = int(ctx.params.get("matrix", 384)), int(ctx.params.get("depth", 8))
    grad_floats = int(ctx.params.get("grad_floats", 1 << 16))
    blocks, block_steps = int(ctx.params.get("blocks", 12)), int(ctx.params.get("block_steps", 40))
    key = jax.random.PRNGKey(ctx.rank)
    w = jax.random.normal(key, (size, size), jnp.float32) / np.sqrt(size)
    x = jax.random.normal(key, (size, size), jnp.float32)
    grads = jnp.ones(grad_floats, jnp.float32)

    @jax.jit
    def work(x):
        for _ in range(depth):
            x = jnp.tanh(x @ w)
        return x, jnp.mean(x)

    def step(report: bool, index: int) -> None:
        _, loss = work(x)
        launcher.allreduce(grads, op="mean")
        value = float(launcher.allreduce(loss, op="mean"))
        if report:
            ctx.report(index, loss=value)

    variants = {"neither": (False, False), "ctx.report": (True, False), "arrival times": (False, True),
                "both": (True, True)}
    for _ in range(20):
        step(False, 0)
    times = {name: [] for name in variants}
    for block in range(blocks):
        order = list(variants)[block % 4:] + list(variants)[:block % 4]  # rotated: no variant always first
        for name in order:
            report, arrivals = variants[name]
            tracker_module.CollectiveTracker.start = ORIGINAL_START if arrivals else start_without_arrivals
            launcher.barrier()
            started = time.perf_counter()
            for i in range(block_steps):
                step(report, i)
            times[name].append((time.perf_counter() - started) / block_steps)
    tracker_module.CollectiveTracker.start = ORIGINAL_START
    per_step = {name: statistics.median(values) for name, values in times.items()}
    calls = 100_000
    started = time.perf_counter()
    for i in range(calls):
        ctx.report(i, loss=0.5)
    per_call = (time.perf_counter() - started) / calls
    base = per_step["neither"]
    rows = [f"| {name} | {seconds * 1e3:.3f} ms | {100 * (seconds / base - 1):+.2f}% |"
            for name, seconds in per_step.items()]
    table = "\n".join(["| variant | step (median of blocks) | vs neither |", "|---|---|---|", *rows])
    if ctx.is_main:
        print(table)
        print(f"ctx.report alone: {per_call * 1e6:.2f} us per call (rank 0, one metric, {calls} calls)", flush=True)
    return {"step_seconds": per_step, "report_seconds_per_call": per_call, "table": table,
            "blocks": blocks, "block_steps": block_steps}
