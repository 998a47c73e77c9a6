"""tqdm over a loop (to stderr, its default), then a result on stdout."""
import time

from tqdm import tqdm

total = 0
for i in tqdm(range(20), desc="steps", mininterval=0):
    total += i
    time.sleep(0.01)
print(f"total {total}")
