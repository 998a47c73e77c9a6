"""A training script as people write them, never calling ctx.report: `jax.distributed.initialize()`,
a jitted step over a global mesh (XLA's all-reduce across processes), and a loader in which rank 1
gets stuck at step --stall-at (alive, never returning, as on a dead filesystem). With --report it
calls launcher.context().report(step) each step. Writes the time the stall began to --stalled."""

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1000)
parser.add_argument("--stall-at", type=int, default=5)
parser.add_argument("--step-sleep", type=float, default=0.1)
parser.add_argument("--stalled", required=True)
parser.add_argument("--report", action="store_true")
args = parser.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize()
mesh = Mesh(np.array(jax.devices()), ("data",))
x = jax.device_put(jnp.ones((4 * jax.device_count(), 3)), NamedSharding(mesh, P("data")))
w = jnp.zeros(3)


@jax.jit
def step_fn(w, x):
    return w - 0.01 * jnp.mean(x, axis=0)


def load_batch(step):
    if step == args.stall_at and jax.process_index() == 1:
        with open(args.stalled, "w") as f:
            f.write(str(time.time()))
        time.sleep(100_000)
    time.sleep(args.step_sleep)
    return x


for step in range(args.steps):
    w = step_fn(w, load_batch(step))
    w.block_until_ready()
    if args.report:
        import launcher

        launcher.context().report(step, total=args.steps)
print("finished", float(w[0]))
