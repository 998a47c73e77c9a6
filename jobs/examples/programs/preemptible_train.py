"""A training script with its own preemption handling, the way orbax-based code does it: JAX's
preemption sync point (jax.distributed's, which listens for SIGTERM) tells every process at the
same step that a notice came; the script saves its checkpoint there and exits 0. With
`preemption_signal: SIGTERM` in the spec, jaxlaunch delivers its notice (Slurm's time-limit
warning, a preemption, `kill -USR2` to `jaxlaunch run`) to every rank as SIGTERM, the run ends
PREEMPTED, and `jaxlaunch run --resume RUN_DIR` (or Slurm's requeue) continues it from the
checkpoint, bit for bit. Orbax's CheckpointManager asks the same sync point in `save()`."""

import argparse
import os
import sys
import time

import jax

jax.distributed.initialize()

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--step-seconds", type=float, default=0.1, help="sleep per step (a stand-in for real work)")
parser.add_argument("--checkpoints", default=os.environ.get("JAXLAUNCH_RUN_DIR", "."),
                    help="folder for checkpoint.npz and final.npy (default: the run directory)")
args = parser.parse_args()
checkpoint = os.path.join(args.checkpoints, "checkpoint.npz")

step, w = 0, np.zeros(8, np.float32)
if os.path.exists(checkpoint):
    saved = np.load(checkpoint)
    step, w = int(saved["step"]), saved["w"]
    print(f"resumed from step {step}", flush=True)
w = jnp.asarray(w)


@jax.jit
def update(w, step):
    return w * 0.99 + jnp.sin(step + jnp.arange(w.shape[0], dtype=jnp.float32))


while step < args.steps:
    if multihost_utils.reached_preemption_sync_point(step):  # True on every process at the same step
        if jax.process_index() == 0:
            np.savez(checkpoint + ".tmp.npz", step=step, w=np.asarray(w))
            os.replace(checkpoint + ".tmp.npz", checkpoint)
        print(f"preempted: saved step {step}", flush=True)
        sys.exit(0)
    w = update(w, float(step))
    step += 1
    time.sleep(args.step_seconds)

if jax.process_index() == 0:
    np.save(os.path.join(args.checkpoints, "final.npy"), np.asarray(w))
print(f"finished {args.steps} steps", flush=True)
