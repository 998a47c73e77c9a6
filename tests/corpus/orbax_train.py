"""Training with orbax-checkpoint as its docs teach it: a bare `jax.distributed.initialize()`, a
global mesh, a `CheckpointManager` that saves every few steps, restores the latest step at start,
and leaves at `reached_preemption` with exit code 0. Nothing here knows about jaxlaunch.

    python orbax_train.py --ckpt-dir DIR --steps N --out FILE [--step-sleep S]
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt-dir", required=True)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--every", type=int, default=5)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--out", required=True)
args = parser.parse_args()

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize()

mesh = Mesh(np.array(jax.devices()), ("data",))
rows = 4 * jax.device_count()
x = jax.device_put(jnp.arange(rows * 3, dtype=jnp.float32).reshape(rows, 3) / 10, NamedSharding(mesh, P("data")))
y = x @ jnp.array([1.0, -2.0, 0.5])
state = {"w": jax.device_put(jnp.zeros(3), NamedSharding(mesh, P())), "step": 0}

options = ocp.CheckpointManagerOptions(save_interval_steps=args.every, max_to_keep=2)
manager = ocp.CheckpointManager(args.ckpt_dir, options=options)
first = 0
if manager.latest_step() is not None:
    first = manager.latest_step()
    state = manager.restore(first, args=ocp.args.StandardRestore(state))
    print(f"restored step {first}", flush=True)


@jax.jit
def train_step(w, x, y):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    return w - 0.1 * grad, loss


for step in range(first, args.steps):
    w, loss = train_step(state["w"], x, y)
    state = {"w": w, "step": step + 1}
    manager.save(step + 1, args=ocp.args.StandardSave(state))
    if manager.reached_preemption(step + 1):
        manager.wait_until_finished()
        print(f"preempted at step {step + 1}", flush=True)
        raise SystemExit(0)
    time.sleep(args.step_sleep)

manager.wait_until_finished()
w = multihost_utils.process_allgather(state["w"], tiled=True)
if jax.process_index() == 0:
    with open(args.out, "w") as f:
        json.dump({"w": [float(v) for v in np.asarray(w)], "loss": float(loss)}, f)
print(f"done: loss {float(loss):.6f}", flush=True)
print(f"LAST LINE {time.time()}", flush=True)
