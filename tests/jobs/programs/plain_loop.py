"""A training loop as a new user writes it: no jaxlaunch, no reports, no checkpoints, no result;
ranks that never talk to each other. `plain_loop.py --steps N --step-sleep S`."""

import argparse
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--step-sleep", type=float, default=0.03)
args = parser.parse_args()

loss = 1.0
for step in range(args.steps):
    loss *= 0.99
    time.sleep(args.step_sleep)
    if step % 20 == 0:
        print(f"step {step} loss {loss:.4f}", flush=True)
print("done", flush=True)
