"""A rank's stacks read while C threads enter Python (issue 51, finding 10), in one process: the
race of a long mpi4jax loop under the monitor, made frequent. Each call into Python from a C
thread that has no thread state makes one (PyGILState_Ensure, outside the GIL), as mpi4jax's
debug log does on XLA's threads; here ctypes' callbacks on short-lived pthreads do it, THREADS of
them at once, while another thread reads the main thread's stack with stacks.stack_of again and
again. faulthandler.dump_traceback(all_threads=True), the reader before, killed this process
with SIGSEGV within a second.

`python thread_state_race.py SECONDS [THREADS]`: prints `read N stacks while C threads made M
thread states; the main thread at FUNCTION` and exits 0, or dies."""

import ctypes
import sys
import threading
import time

from launcher.rank import stacks

SECONDS = float(sys.argv[1])
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 4

libc = ctypes.CDLL(None)
START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


@START
def enter_python(arg):  # runs on a new pthread: ctypes makes it a thread state, and frees it after
    return None


libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, START, ctypes.c_void_p]
libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
stop = threading.Event()
made = [0] * THREADS


def churn(index):
    thread = ctypes.c_ulong()
    while not stop.is_set():
        if libc.pthread_create(ctypes.byref(thread), None, enter_python, None) == 0:
            libc.pthread_join(thread, None)
            made[index] += 1


def read_stacks(main, seen):
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        seen["stack"] = stacks.stack_of(main)
        seen["reads"] += 1
        time.sleep(0)  # lets the C threads have the GIL: they make their states meanwhile
    stop.set()


def main_thread_waits(reader):
    while reader.is_alive():  # the main thread waits, as a rank's does in XLA or MPI
        time.sleep(0.005)


churners = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(THREADS)]
for churner in churners:
    churner.start()
seen = {"reads": 0, "stack": []}
reader = threading.Thread(target=read_stacks, args=(threading.main_thread().ident, seen))
reader.start()
main_thread_waits(reader)
for churner in churners:
    churner.join(10)
where = next((function for _, _, function in seen["stack"] if function == "main_thread_waits"), None)
print(f"read {seen['reads']} stacks while C threads made {sum(made)} thread states; the main thread at {where}",
      flush=True)
