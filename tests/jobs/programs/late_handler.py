"""A program whose preemption handler comes late: it starts up for START seconds (as a real one
imports, reads its data, joins jax.distributed) before it installs its SIGUSR1 handler, then waits
for the notice, and exits 0 once it heard it (3 when it never did)."""

import signal
import sys
import time

start_seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
time.sleep(start_seconds)
heard = []
signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
print("handler installed", flush=True)
deadline = time.monotonic() + 60
while not heard and time.monotonic() < deadline:
    time.sleep(0.05)
print("notice heard" if heard else "no notice", flush=True)
sys.exit(0 if heard else 3)
