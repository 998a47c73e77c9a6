"""Cost of the collective tracker (the watchdog's hot-path part) on launcher.allreduce: the same
8-byte allreduce with the tracker's calls in place and replaced by no-ops, in interleaved blocks,
median per call. One process, no mpirun:

    .venv/bin/python tests/tracker_cost.py
"""
import statistics, time
import jax.numpy as jnp
import launcher
from launcher.runtime import monitor

x = jnp.ones(2, jnp.float32)
real = (monitor.CollectiveTracker.start, monitor.CollectiveTracker.dispatched)
def noop_start(self, name): return 0
def noop_dispatched(self, seq, name, handle): pass
def block(n=500):
    t = time.perf_counter()
    for _ in range(n):
        y = launcher.allreduce(x)
    y.block_until_ready()
    return (time.perf_counter() - t) / n
for _ in range(3): block()
on, off = [], []
for i in range(40):
    monitor.CollectiveTracker.start, monitor.CollectiveTracker.dispatched = real
    on.append(block())
    monitor.CollectiveTracker.start, monitor.CollectiveTracker.dispatched = noop_start, noop_dispatched
    off.append(block())
monitor.CollectiveTracker.start, monitor.CollectiveTracker.dispatched = real
t = monitor.TRACKER
n = 200000
s = time.perf_counter()
for _ in range(n):
    seq = t.start("allreduce"); t.dispatched(seq, "allreduce", x)
hot = (time.perf_counter() - s) / n
print(f"allreduce 8 B, 1 rank: tracker on {statistics.median(on)*1e6:.2f} us, off {statistics.median(off)*1e6:.2f} us per call; "
      f"tracker calls alone {hot*1e6:.3f} us")
