"""Cost of ctx.should_stop() per step: the one MPI allreduce that makes every rank agree, median
of 20 blocks of 2000 calls, next to a training step of jobs/examples/train_data_parallel.py (gradient and
loss allreduce included) for scale. Run under the launcher's mpirun:

    .venv/bin/mpirun -n 2 --oversubscribe --bind-to none .venv/bin/python tests/should_stop_cost.py
"""
import statistics
import time

from mpi4py import MPI

from launcher.rank.preemption import should_stop

comm = MPI.COMM_WORLD


def block(n=2000):
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(n):
        should_stop()
    return (time.perf_counter() - started) / n


for _ in range(3):
    block()
median = statistics.median(block() for _ in range(20))
if comm.Get_rank() == 0:
    print(f"should_stop(): {median * 1e6:.1f} us per call, median of 20 x 2000, {comm.Get_size()} ranks")
