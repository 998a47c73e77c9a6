"""The hang watchdog's corpus of stalls (tests/e2e/test_stall_corpus.py): a program written as a user
would, without jaxlaunch in mind (mpi4py, subprocess, sockets, JAX), never reporting progress.

    stalls.py --legit SECONDS     every legitimate long wait in turn, each SECONDS long: must end
    stalls.py --hang NAME         rank 1 (or every rank, for a deadlock) hangs for ever as NAME says

The ranks other than the one that stalls wait for it at an MPI barrier or in an MPI allreduce, as
a program's peers wait at their next collective. Each case prints `case NAME` when it starts."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def busy_for(seconds):
    end, total = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        total += sum(i * i for i in range(1000))
    return total


def xla_work(seconds):
    """One jitted computation of about `seconds` on this rank's CPU (sized by a short trial)."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def loop(x, n):
        return jax.lax.fori_loop(0, n, lambda i, y: jnp.tanh(y @ y) * 0.5, x)

    x = jnp.ones((192, 192)) * 0.01
    loop(x, 10).block_until_ready()
    started = time.monotonic()
    loop(x, 200).block_until_ready()
    per_step = max((time.monotonic() - started) / 200, 1e-5)
    return loop(x, int(seconds / per_step)).block_until_ready()


def compile_for_a_while(ops=1500):
    import jax
    import jax.numpy as jnp

    def deep(x):
        for i in range(ops):
            x = jnp.sin(x) * 0.999 + i * 1e-6
        return x

    return jax.jit(deep)(jnp.ones(4)).block_until_ready()


# --- legitimate long waits: rank 0 (or every rank) is busy or waits on something that answers ---

def legit_eval(seconds):            # rank 0 evaluates alone in pure Python
    busy_for(seconds)


def legit_upload(seconds):          # rank 0 waits on its child at 100% CPU (gsutil, aws s3 cp)
    subprocess.run([sys.executable, "-c", f"import time\nend = time.monotonic() + {seconds}\n"
                    "while time.monotonic() < end: sum(range(1000))"], check=True)


def legit_child_io(seconds):        # rank 0 waits on a child that moves bytes at little CPU
    subprocess.run([sys.executable, "-c", f"import time\nend = time.monotonic() + {seconds}\n"
                    "src, dst = open('/dev/zero', 'rb'), open('/dev/null', 'wb')\n"
                    "while time.monotonic() < end:\n    dst.write(src.read(1 << 20)); time.sleep(0.005)"],
                   check=True)


def legit_network(seconds):         # rank 0 reads a reply that an evaluation server sends later
    ours, server = socket.socketpair()
    threading.Timer(seconds, server.sendall, (b"x",)).start()
    ours.recv(1)


def legit_callback(seconds):        # a host callback that XLA runs on process 0
    import jax
    import jax.numpy as jnp
    import numpy as np

    def slow(x):
        time.sleep(seconds)
        return np.asarray(x) + 1

    f = jax.jit(lambda x: jax.pure_callback(slow, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    f(jnp.ones(3)).block_until_ready()


def legit_write(seconds):           # rank 0 writes a checkpoint of its own while the others wait
    path = f"{os.environ.get('STALLS_DIR', '.')}/ckpt-{RANK}.bin"
    end, chunk = time.monotonic() + seconds, b"\0" * (1 << 20)
    with open(path, "wb") as out:
        while time.monotonic() < end:
            out.write(chunk)
            if out.tell() > (256 << 20):
                out.seek(0)
    os.unlink(path)


def legit_restore(seconds):        # rank 0 restores a checkpoint of its own, read back in pieces
    path = f"{os.environ.get('STALLS_DIR', '.')}/restore-{RANK}.bin"
    with open(path, "wb") as out:
        out.write(os.urandom(1 << 20) * 64)
    end, total = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        with open(path, "rb") as source:
            while chunk := source.read(1 << 20):
                total += chunk[0]
    os.unlink(path)
    return total


def legit_thread(seconds):          # rank 0's main thread joins a worker thread that computes
    worker = threading.Thread(target=busy_for, args=(seconds,))
    worker.start()
    worker.join()


def legit_progress(seconds):        # rank 0 prints a line every half second
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        print(f"rank {RANK}: working", flush=True)
        time.sleep(0.5)


def legit_compile(seconds):         # rank 0 traces and compiles a deep function
    compile_for_a_while()


def every_rank_sleep(seconds):      # every rank at one place in its own code (a paced loader)
    time.sleep(seconds)


def every_rank_xla(seconds):        # one long XLA computation on every rank
    xla_work(seconds)


LEGIT_RANK0 = [legit_eval, legit_upload, legit_child_io, legit_network, legit_restore, legit_callback,
               legit_write, legit_thread, legit_progress, legit_compile]
LEGIT_EVERY_RANK = [every_rank_sleep, every_rank_xla]


def run_legit(seconds):
    for case in LEGIT_RANK0 + LEGIT_EVERY_RANK:
        COMM.Barrier()
        if RANK == 0:
            print(f"case {case.__name__}", flush=True)
        if RANK == 0 or case in LEGIT_EVERY_RANK:
            case(seconds)
        COMM.Barrier()  # the others wait here for rank 0
    if RANK == 0:
        print("every legitimate wait ended", flush=True)


# --- real hangs: rank 1 never arrives (or every rank waits for another) ---------------------------

def stop_self_in(seconds):
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGSTOP)).start()


def read_shard():
    time.sleep(10**6)


def hang_stopped_step():
    os.kill(os.getpid(), signal.SIGSTOP)


def hang_stopped_compile():
    stop_self_in(0.5)
    compile_for_a_while(20000)


def hang_stopped_write():
    stop_self_in(0.5)
    legit_write(10**6)


def hang_loader():
    read_shard()


def hang_lock():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never released


def hang_gil():
    import re

    re.match(r"(a+)+$", "a" * 64 + "b")  # holds the GIL in C for ever: its monitor cannot speak


def hang_network():
    ours, _server = socket.socketpair()
    ours.recv(1)  # a server that never answers


def hang_killed():
    os.kill(os.getpid(), signal.SIGKILL)  # dead without a word


def hang_child():
    subprocess.run(["sleep", "1000000"])


HANGS = {name[len("hang_"):]: fn for name, fn in globals().items() if name.startswith("hang_")}


def run_hang(name):
    COMM.Barrier()
    for _ in range(60):  # a few seconds of a healthy job first: every monitor has said where it stands
        time.sleep(0.05)
    print(f"case {name} on rank 1", flush=True) if RANK == 1 else None
    if name == "deadlock":  # ranks 0 and 1 each wait to receive from the other
        if RANK in (0, 1):
            COMM.recv(source=1 - RANK)
        COMM.Barrier()
        return
    if RANK == 1:
        with open(os.path.join(os.environ.get("STALLS_DIR", "."), "stalled"), "w") as note:
            note.write(f"{time.time()}\n")
        HANGS[name]()
    if name == "loader":
        COMM.allreduce(RANK)  # an MPI wait that spins
    COMM.Barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--legit", type=float)
    parser.add_argument("--hang", choices=[*HANGS, "deadlock"])
    args = parser.parse_args()
    if args.legit:
        run_legit(args.legit)
    else:
        run_hang(args.hang)


if __name__ == "__main__":
    main()
