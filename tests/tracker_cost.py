"""Cost of the collective tracker (the watchdog's hot-path part) on launcher.allreduce: the same
8-byte allreduce with the tracker's calls in place and replaced by no-ops, in interleaved blocks,
median per call. An 8-byte device array takes the staged path (start, enter, leave: a counter,
two clock reads and a few stores). One process, no mpirun:

    .venv/bin/python tests/tracker_cost.py
"""
import statistics, time
import jax.numpy as jnp
import launcher
from launcher.rank import monitor

x = jnp.ones(2, jnp.float32)
Tracker = monitor.CollectiveTracker
HOT = ("start", "dispatched", "enter", "leave")
real = {name: getattr(Tracker, name) for name in HOT}
noops = {"start": lambda self, name: 0, "dispatched": lambda self, seq, name, handle: None,
         "enter": lambda self, seq, name: None, "leave": lambda self: None}
def use(methods):
    for name, method in methods.items():
        setattr(Tracker, name, method)
def block(n=500):
    t = time.perf_counter()
    for _ in range(n):
        y = launcher.allreduce(x)
    y.block_until_ready()
    return (time.perf_counter() - t) / n
for _ in range(3): block()
on, off = [], []
for i in range(40):
    use(real)
    on.append(block())
    use(noops)
    off.append(block())
use(real)
t = monitor.TRACKER
n = 200000
s = time.perf_counter()
for _ in range(n):
    seq = t.start("allreduce"); t.enter(seq, "allreduce"); t.leave()
hot = (time.perf_counter() - s) / n
print(f"allreduce 8 B, 1 rank: tracker on {statistics.median(on)*1e6:.2f} us, off {statistics.median(off)*1e6:.2f} us per call; "
      f"tracker calls alone (start, enter, leave) {hot*1e6:.3f} us")
