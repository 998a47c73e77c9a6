"""plain_loop.py with a fork-based process pool, as a user's data loader has: its workers inherit the
rank's environment (the rank's variables too). `pool_loop.py --steps N --step-sleep S`."""

import argparse
import concurrent.futures
import multiprocessing
import time

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--step-sleep", type=float, default=0.03)
args = parser.parse_args()

pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
loss = 1.0
for step in range(args.steps):
    loss *= pool.submit(float, 0.99).result()
    time.sleep(args.step_sleep)
    if step % 20 == 0:
        print(f"step {step} loss {loss:.4f}", flush=True)
pool.shutdown()
print("done", flush=True)
