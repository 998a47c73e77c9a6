"""Scaling of a data-parallel training step, one core per process.

Each process trains the same small MLP (a list of {"w", "b"} layers) on its slice of the data:
gradients come from a jitted value_and_grad, are averaged over the processes with
launcher.allreduce(op="mean"), and a jitted SGD update applies them, so every replica takes
the same step.

  mode "strong": `batch` is the GLOBAL batch, split over ctx.size processes (it must divide);
                 ideal: the step takes 1/size of the time.
  mode "weak":   `batch` is the batch of EACH process; ideal: the step takes the same time.

One core per process: mpirun runs the ranks with --bind-to none (launcher/backends/mpirun.py), and JAX's
CPU client has already started its thread pools (sized from os.cpu_count()) by the time main()
runs, so every thread of this process is pinned here with sched_setaffinity, to one core chosen
by the LOCAL rank. Threads created later inherit the mask of the thread that creates them. The
spec also sets --xla_cpu_multi_thread_eigen=false (single-threaded Eigen in XLA's kernels) and
the OpenMP/BLAS thread counts to 1. The pinning is checked, not assumed: `cores_used` is the
process's CPU time divided by the wall time over the timed steps (at most about 1.0 for a
process that uses one core), and `threads_pinned` is the fraction of this process's threads
whose affinity is exactly its core at the end.

Timing: `warmup` steps first (they include compilation), then a barrier, then `steps` timed
steps, each ended by block_until_ready on the new parameters. A step counts as long as its
slowest process (MAX over processes per step); step_seconds is the median over steps.
`jobs/benchmarks/scaling_report.py SWEEP_DIR` turns a sweep of this job into efficiencies, JSON and a PNG.
"""

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import launcher

MODES = ("strong", "weak")


def pin_to_core(core: int) -> int:
    """Pin every thread of this process to `core`; returns how many threads there were.

    os.sched_setaffinity(tid, ...) sets one thread's mask on Linux, so each TID of
    /proc/self/task is set; the listing is repeated until no new thread appeared meanwhile."""
    done: set[int] = set()
    while True:
        tids = {int(t) for t in os.listdir("/proc/self/task")}
        new = tids - done
        if not new:
            return len(tids)
        for tid in new:
            try:
                os.sched_setaffinity(tid, {core})
            except ProcessLookupError:  # the thread ended between the listing and the call
                pass
        done |= new


def threads_on(core: int) -> tuple[int, int]:
    """(threads whose affinity is exactly {core}, threads) of this process, now."""
    pinned = total = 0
    for name in os.listdir("/proc/self/task"):
        try:
            mask = os.sched_getaffinity(int(name))
        except ProcessLookupError:
            continue
        total += 1
        pinned += mask == {core}
    return pinned, total


def init_params(sizes, seed):
    """He-initialised layers [{"w": (m, n), "b": (n,)}, ...], the same on every process."""
    rng = np.random.default_rng(seed)
    return [{"w": jnp.asarray(rng.normal(0.0, np.sqrt(2.0 / m), size=(m, n)).astype(np.float32)),
             "b": jnp.zeros(n, jnp.float32)}
            for m, n in zip(sizes[:-1], sizes[1:])]


def loss_fn(params, x, y):
    h = x
    for layer in params[:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    logits = h @ params[-1]["w"] + params[-1]["b"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def make_data(ctx, per_process, features, classes, seed):
    """This process's rows of one global data set of per_process * size examples: labels from a
    fixed random linear teacher, so the loss falls and the gradients are not noise."""
    rng = np.random.default_rng(seed)
    teacher = rng.normal(size=(features, classes)).astype(np.float32)
    x = rng.normal(size=(per_process * ctx.size, features)).astype(np.float32)
    y = np.argmax(x @ teacher, axis=1).astype(np.int32)
    rows = slice(ctx.rank * per_process, (ctx.rank + 1) * per_process)
    device = ctx.local_devices[0]
    return jax.device_put(x[rows], device), jax.device_put(y[rows], device)


def check_params(mode, batch, size, steps, warmup):
    if mode not in MODES:
        raise ValueError(f"params.mode={mode!r}: expected one of {', '.join(MODES)}")
    if steps < 1 or warmup < 1:
        raise ValueError(f"params.steps={steps}, params.warmup={warmup}: both must be at least 1 "
                         f"(the warm-up steps absorb compilation, which must not be timed)")
    if mode == "strong" and batch % size:
        raise ValueError(f"params.batch={batch} (the global batch in strong mode) does not split evenly over "
                         f"{size} processes; pick a multiple of {size}")


def main(ctx: launcher.JobContext):
    mode = str(ctx.params.get("mode", "strong"))
    batch = int(ctx.params.get("batch", 512))
    features = int(ctx.params.get("features", 256))
    hidden = int(ctx.params.get("hidden", 512))
    layers = int(ctx.params.get("layers", 3))  # hidden layers; one output layer more
    classes = int(ctx.params.get("classes", 10))
    steps = int(ctx.params.get("steps", 100))
    warmup = int(ctx.params.get("warmup", 5))
    lr = float(ctx.params.get("learning_rate", 0.05))
    seed = int(ctx.params.get("seed", 0))
    repeat = ctx.params.get("repeat", 0)  # only labels the run: the sweep repeats each configuration
    pin = bool(ctx.params.get("pin", True))  # false: the control run, to see what unpinned looks like
    check_params(mode, batch, ctx.size, steps, warmup)
    per_process = batch // ctx.size if mode == "strong" else batch

    allowed = sorted(os.sched_getaffinity(0))
    core = allowed[ctx.local_rank % len(allowed)]
    if pin:
        if ctx.local_size > len(allowed):
            ctx.logger.warning("%d processes on this node but only %d cores: cores are shared, the figures "
                               "mean little", ctx.local_size, len(allowed))
        threads = pin_to_core(core)
        ctx.logger.info("pinned %d threads to core %d (cores allowed before: %s)", threads, core, allowed)

    sizes = [features] + [hidden] * layers + [classes]
    params = init_params(sizes, seed)
    x, y = make_data(ctx, per_process, features, classes, seed)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn))
    update = jax.jit(lambda p, g: jax.tree_util.tree_map(lambda a, b: a - lr * b, p, g))

    def train_step(params):
        loss, grads = grad_fn(params, x, y)
        grads = launcher.allreduce(grads, op="mean")  # one fused MPI call for the whole tree
        return jax.block_until_ready(update(params, grads)), loss

    first_loss = None
    for _ in range(warmup):  # compilation and first-touch costs, untimed
        params, loss = train_step(params)
        first_loss = float(loss) if first_loss is None else first_loss

    launcher.barrier()
    times = np.empty(steps)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for i in range(steps):
        start = time.perf_counter()
        params, loss = train_step(params)
        times[i] = time.perf_counter() - start
    cpu, wall = time.process_time() - cpu_start, time.perf_counter() - wall_start
    pinned, threads = threads_on(core)

    # The allreduce alone, on a gradient-sized tree: how much of the step is communication.
    _, grads = grad_fn(params, x, y)
    jax.block_until_ready(launcher.allreduce(grads, op="mean"))
    launcher.barrier()
    reduce_times = np.empty(steps)
    for i in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(launcher.allreduce(grads, op="mean"))
        reduce_times[i] = time.perf_counter() - start

    times = launcher.allreduce(times, op="max")          # a step lasts as long as its slowest process
    reduce_times = launcher.allreduce(reduce_times, op="max")
    per_rank = launcher.allgather(np.array([cpu / wall, pinned / threads, core, threads], np.float64))
    per_rank = per_rank.reshape(ctx.size, 4)
    final_loss = float(launcher.allreduce(np.float64(loss), op="mean"))
    checksum = np.float64(sum(float(jnp.sum(leaf)) for leaf in jax.tree_util.tree_leaves(params)))
    in_sync = bool(launcher.allreduce(checksum, op="max") == launcher.allreduce(checksum, op="min"))

    step_seconds = float(np.median(times))
    n_params = sum(int(leaf.size) for leaf in jax.tree_util.tree_leaves(params))
    result = {
        "mode": mode, "processes": ctx.size, "repeat": repeat, "cpu_count": os.cpu_count(),
        "per_process_batch": per_process, "global_batch": per_process * ctx.size,
        "step_seconds": step_seconds, "step_seconds_mean": float(np.mean(times)),
        "step_seconds_min": float(np.min(times)),
        "examples_per_second": per_process * ctx.size / step_seconds,
        "allreduce_seconds": float(np.median(reduce_times)),
        "cores_used": float(per_rank[:, 0].max()),               # the busiest process
        "cores_used_per_process": [float(v) for v in per_rank[:, 0]],
        "threads_pinned": float(per_rank[:, 1].min()),           # 1.0: every thread of every process
        "threads_per_process": [int(v) for v in per_rank[:, 3]],
        "pinned": pin, "cores": [int(v) for v in per_rank[:, 2]] if pin else None,
        "parameters": n_params, "gradient_bytes": 4 * n_params, "layer_sizes": sizes,
        "steps": steps, "warmup": warmup, "first_loss": first_loss, "final_loss": final_loss,
        "replicas_in_sync": in_sync, "load_average_1min": os.getloadavg()[0],
        "step_seconds_all": [float(t) for t in times],
    }
    ctx.logger.info("%s, %d processes: step %.3f ms (median of %d), %.0f examples/s, cores used per process %s",
                    mode, ctx.size, 1e3 * step_seconds, steps, result["examples_per_second"],
                    ", ".join(f"{v:.2f}" for v in result["cores_used_per_process"]))
    return result
