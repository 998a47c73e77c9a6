"""A global-mesh training job (jax_distributed: true: XLA does the cross-process reduction inside
one jit, no launcher collective in the step) that can hang in the ways real jobs do, for the hang
watchdog and roll-call tests (tests/e2e/test_hangs.py, tests/slurm/test_slurm_hangs.py).

params:
  how           none (healthy), loader (a rank stops entering the step: stuck reading its batch),
                deadlock (a rank deadlocks in its own threads while the others wait at
                launcher.barrier('epoch', timeout=barrier_timeout)), sync (the same, the others in
                multihost_utils.sync_global_devices), checkpoint_read (the stalled rank reads the newest
                checkpoint back, and the read blocks, while the others go on to the next step), slow_compile (the step at stall_at
                needs a long compile, on every rank, then the job goes on)
  stall_rank    which rank misbehaves (1); stall_at: at which step (8); stall_attempt: on which
                attempt (0; -1: every attempt)
  steps, every  steps to train (24), a checkpoint every `every` steps (4)
The result is the final weights: bit-identical however often the job was stopped and resumed.
"""

import os
import shutil
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import launcher
from launcher.rank.checkpoints import load_checkpoint


def read_batch(ctx, step, x, stalled):
    if stalled:
        time.sleep(100_000)  # a loader stuck on a dead filesystem: alive, never returns
    return x


def deadlock_in_own_threads():
    """Two locks taken in opposite orders by two threads: the classic deadlock."""
    first, second = threading.Lock(), threading.Lock()
    first.acquire()
    worker_holds_second = threading.Event()

    def worker():
        with second:
            worker_holds_second.set()
            first.acquire()

    threading.Thread(target=worker, daemon=True).start()
    worker_holds_second.wait()
    second.acquire()  # never returns


def read_blocked_checkpoint(ctx):
    """Read the newest checkpoint back from a copy whose data files are FIFOs with no writer: the
    read blocks in open(), as one from a hung network filesystem does."""
    newest = max(ctx.checkpoints.directory.glob("step-*"))
    copy = ctx.run_dir / f"blocked-{ctx.rank}" / newest.name
    shutil.copytree(newest, copy)
    for data in copy.glob("*.data"):
        data.unlink()
        os.mkfifo(data)
    load_checkpoint(copy)  # never returns


def slow_function(x, ops):
    for i in range(ops):
        x = jnp.sin(x) * 1.0001 + i
    return x


def main(ctx):
    p = ctx.params
    how, stall_rank, stall_at = p.get("how", "none"), int(p.get("stall_rank", 1)), int(p.get("stall_at", 8))
    stall_attempt = int(p.get("stall_attempt", 0))
    steps, every = int(p.get("steps", 24)), int(p.get("every", 4))
    this_attempt = stall_attempt in (-1, ctx.attempt)

    mesh = Mesh(np.array(jax.devices()), ("data",))
    rows, features = 8 * jax.local_device_count(), 4
    rng = np.random.default_rng(jax.process_index())
    x_local = rng.normal(size=(rows, features)).astype(np.float32)
    x = multihost_utils.host_local_array_to_global_array(x_local, mesh, P("data"))
    y = multihost_utils.host_local_array_to_global_array(x_local @ np.arange(1.0, 5.0, dtype=np.float32),
                                                         mesh, P("data"))
    w = jax.device_put(jnp.zeros(features), NamedSharding(mesh, P()))
    first = 0
    restored = ctx.checkpoints.restore(like={"w": w})
    if restored is not None:
        first, state = restored
        w = state["w"]

    @jax.jit
    def train_step(w, x, y):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.05 * grad, loss  # the mean over the global batch: XLA's all-reduce across processes

    for step in range(first, steps):
        stalled = this_attempt and step == stall_at
        if stalled and ctx.rank == stall_rank and how != "none":
            (ctx.run_dir / "stalled").write_text(f"{time.time()} {ctx.rank} {step}")  # when the stall began
        if stalled and how == "deadlock" and ctx.rank == stall_rank:
            deadlock_in_own_threads()
        if stalled and how == "deadlock":
            launcher.barrier("epoch", timeout=float(p.get("barrier_timeout", 600)))
        if stalled and how == "sync":
            if ctx.rank == stall_rank:
                deadlock_in_own_threads()
            multihost_utils.sync_global_devices("epoch")
        if stalled and how == "checkpoint_read" and ctx.rank == stall_rank:
            read_blocked_checkpoint(ctx)
        if stalled and how == "slow_compile":
            w = w + 0 * jax.jit(slow_function, static_argnums=1)(w, int(p.get("ops", 3000)))
        batch = read_batch(ctx, step, x, stalled and how == "loader" and ctx.rank == stall_rank)
        w, loss = train_step(w, batch, y)
        ctx.report(step, total=steps, loss=loss)
        time.sleep(float(p.get("step_seconds", 0.05)))
        if (step + 1) % every == 0:
            ctx.checkpoints.save(step + 1, {"w": w})
    return {"w": [float(v) for v in np.asarray(multihost_utils.process_allgather(w, tiled=True))],
            "attempt": ctx.attempt}
