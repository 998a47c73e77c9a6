"""Batched float32 matmul, timed correctly, every way a jaxlaunch job can run it, side by side.

Methods (the same batch, A (batch, m, k) @ B (batch, k, n)):
  numpy (BLAS)            np.matmul on the host: the reference
  jax.jit, 1 device       the whole batch on the process's first device
  pmap, local devices     the batch split over the process's devices
  jit + NamedSharding     the batch sharded over ctx.mesh (axis "devices"), one jitted call
  all processes           every process takes its share of the batch (by rank) and shards it over
                          its own mesh; timed from a barrier before to a barrier after, as one
                          aggregate figure for the whole batch
  jax.jit, dispatch only  the jit call timed WITHOUT block_until_ready: what that mistake measures

JAX dispatches asynchronously: a call returns once the work is queued, not done. Correct figures:
warm-up (and compilation) excluded, jax.block_until_ready on every repeat, median of repeats.
Every method's output is checked against NumPy before it is timed. The single-process methods run
on rank 0 while the other ranks sleep, so they do not compete for a node's cores.

"cores used" is process CPU time (user + sys, all threads) over the timed repeats divided by their
wall time (for all processes: summed over processes). With emulated CPU devices
(--xla_force_host_platform_device_count) every device of a process shares the process's cores, so
more devices do not mean more hardware; this figure shows what a method really used.

Writes bench.json and bench_matmul.png into the run directory; rank 0 prints the table.
"""

import io
import json
import os
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from mpi4py import MPI

import launcher
from launcher.rundir import atomic_write_bytes

DEFAULT_SHAPES = [[256, 64, 64, 64], [32, 256, 256, 256], [4, 1024, 1024, 1024]]  # batch, m, k, n
WARMUP = 3
NUMPY, JIT, PMAP, SHARDED, ALL, DISPATCH = (
    "numpy (BLAS)", "jax.jit, 1 device", "pmap, local devices", "jit + NamedSharding (ctx.mesh)",
    "all processes", "jax.jit, dispatch only (wrong)")
METHODS = [NUMPY, JIT, PMAP, SHARDED, ALL, DISPATCH]
# Checks against NumPy: rtol = tol, atol = tol * sqrt(k) (entries are N(0, 1), so an output, a sum of
# k products, is of size sqrt(k), and rounding differences from another summation order grow with it).
# "highest": true float32 on every platform; "default": the platform's choice (TF32 on recent
# NVIDIA GPUs, 10 mantissa bits), faster on GPU, hence the looser tolerance.
PRECISIONS = {"highest": 1e-4, "default": 1e-2}


@dataclass
class Timing:
    seconds: float  # median wall time of one repeat
    cores: float    # CPU seconds / wall seconds over the timed repeats


def time_repeats(call, repeats, block=True):
    """Median of `repeats` timed calls after WARMUP untimed ones (compilation included there).
    block=False is the mistake the dispatch-only column shows: the timer stops at dispatch."""
    for _ in range(WARMUP):
        jax.block_until_ready(call())
    times = np.empty(repeats)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    for i in range(repeats):
        start = time.perf_counter()
        out = call()
        if block:
            jax.block_until_ready(out)
        times[i] = time.perf_counter() - start
    jax.block_until_ready(out)  # dispatch only: the queued work runs now; its cores are counted too
    cores = (time.process_time() - cpu_start) / (time.perf_counter() - wall_start)
    return Timing(float(np.median(times)), cores)


def time_all_processes(call, repeats):
    """Every process runs its share; a repeat lasts from a barrier before to a barrier after, the
    slowest rank's time. CPU is counted outside the barriers (a waiting rank spins in MPI) and
    summed over processes."""
    for _ in range(WARMUP):
        jax.block_until_ready(call())
    times, cpu = np.empty(repeats), 0.0
    for i in range(repeats):
        launcher.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        jax.block_until_ready(call())
        cpu += time.process_time() - cpu_start
        launcher.barrier()
        times[i] = time.perf_counter() - start
    times = launcher.allreduce(times, op="max")
    cpu = float(launcher.allreduce(np.array([cpu]))[0])
    return Timing(float(np.median(times)), cpu / float(times.sum()))


def on_rank0_alone(ctx, comm, work):
    """Rank 0 runs `work` while the other ranks sleep: Open MPI's blocking barrier polls at 100% of
    a core, which on a shared node would take cores from what rank 0 is timing."""
    result = work() if ctx.is_main else None
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)
    return result


def check(name, got, want, k, precision):
    tol = PRECISIONS[precision]
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=tol, atol=tol * np.sqrt(k),
                               err_msg=f"{name} differs from NumPy")


def single_process_methods(ctx, a, b, repeats, precision, matmul):
    """NumPy, jit on one device, pmap and NamedSharding over the local devices, dispatch only."""
    devices = ctx.local_devices
    d = len(devices)
    batch, _, k = a.shape
    want = np.matmul(a, b)
    check(NUMPY, want, want, k, precision)

    one = devices[0]
    a1, b1 = jax.device_put(a, one), jax.device_put(b, one)
    check(JIT, matmul(a1, b1), want, k, precision)

    mapped = jax.pmap(matmul, devices=devices)
    place = jax.pmap(lambda x: x, devices=devices)  # inputs laid out as pmap wants: no copy when timed
    ap = place(a.reshape(d, batch // d, *a.shape[1:]))
    bp = place(b.reshape(d, batch // d, *b.shape[1:]))
    check(PMAP, mapped(ap, bp), want, k, precision)

    rows = NamedSharding(ctx.mesh, PartitionSpec("devices"))
    sharded = jax.jit(matmul, in_shardings=(rows, rows), out_shardings=rows)
    as_, bs = jax.device_put(a, rows), jax.device_put(b, rows)
    check(SHARDED, sharded(as_, bs), want, k, precision)

    return {
        NUMPY: time_repeats(lambda: np.matmul(a, b), repeats),
        JIT: time_repeats(lambda: matmul(a1, b1), repeats),
        PMAP: time_repeats(lambda: mapped(ap, bp), repeats),
        SHARDED: time_repeats(lambda: sharded(as_, bs), repeats),
        DISPATCH: time_repeats(lambda: matmul(a1, b1), repeats, block=False),
    }


def all_processes_method(ctx, a, b, repeats, precision, matmul):
    """This rank's share of the batch, sharded over its own mesh; checked against NumPy on that share."""
    share = a.shape[0] // ctx.size
    mine = slice(ctx.rank * share, (ctx.rank + 1) * share)
    a_mine, b_mine = a[mine], b[mine]
    rows = NamedSharding(ctx.mesh, PartitionSpec("devices"))
    sharded = jax.jit(matmul, in_shardings=(rows, rows), out_shardings=rows)
    am, bm = jax.device_put(a_mine, rows), jax.device_put(b_mine, rows)
    check(f"{ALL} (rank {ctx.rank}'s share)", sharded(am, bm), np.matmul(a_mine, b_mine), a.shape[2], precision)
    return time_all_processes(lambda: sharded(am, bm), repeats)


def check_shapes(shapes, processes, devices):
    for shape in shapes:
        if len(shape) != 4 or any(int(x) < 1 for x in shape):
            raise ValueError(f"params.shapes: {shape} is not [batch, m, k, n] with positive sizes")
        if int(shape[0]) % (processes * devices):
            raise ValueError(
                f"params.shapes: batch {shape[0]} of {shape} must be a multiple of processes x devices per "
                f"process = {processes} x {devices} = {processes * devices}, so every method splits it evenly")


def main(ctx):
    shapes = [[int(x) for x in s] for s in ctx.params.get("shapes", DEFAULT_SHAPES)]
    repeats = int(ctx.params.get("repeats", 20))
    precision = str(ctx.params.get("precision", "highest"))
    if precision not in PRECISIONS:
        raise ValueError(f"params.precision: {precision!r} is not one of {sorted(PRECISIONS)}")
    check_shapes(shapes, ctx.size, ctx.num_local_devices)
    matmul = jax.jit(lambda x, y: jnp.matmul(x, y, precision=precision))
    comm = MPI.COMM_WORLD.Clone()  # the job's own, for the sleeping wait
    devices = {NUMPY: "host", JIT: "1", PMAP: str(ctx.num_local_devices), SHARDED: str(ctx.num_local_devices),
               ALL: f"{ctx.size} x {ctx.num_local_devices}", DISPATCH: "1"}

    rows = []
    for batch, m, k, n in shapes:
        rng = np.random.default_rng(0)  # the same batch on every rank: each takes its share of it
        a = rng.standard_normal((batch, m, k), dtype=np.float32)
        b = rng.standard_normal((batch, k, n), dtype=np.float32)
        timings = on_rank0_alone(ctx, comm, lambda: single_process_methods(ctx, a, b, repeats, precision, matmul))
        everyone = all_processes_method(ctx, a, b, repeats, precision, matmul)
        if ctx.is_main:
            timings[ALL] = everyone
            flops = 2.0 * batch * m * k * n
            rows.append({"shape": [batch, m, k, n], "flops": flops,
                         "seconds": {name: timings[name].seconds for name in METHODS},
                         "gflops": {name: flops / timings[name].seconds / 1e9 for name in METHODS},
                         "cores_used": {name: timings[name].cores for name in METHODS}})
    comm.Free()

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    affinities = launcher.allgather(np.array([affinity])).tolist()
    if not ctx.is_main:
        return None
    platform = ctx.local_devices[0].platform
    report = {"methods": METHODS, "devices": devices, "rows": rows, "repeats": repeats, "warmup": WARMUP,
              "precision": precision, "platform": platform, "device_kind": ctx.local_devices[0].device_kind,
              "processes": ctx.size, "devices_per_process": ctx.num_local_devices,
              "cpu_count": os.cpu_count(), "sched_getaffinity_per_rank": affinities,
              "jax": jax.__version__, "numpy": np.__version__}
    table = format_table(rows, devices) + "\n" + footnote(report)
    print(table, flush=True)
    atomic_write_bytes(ctx.run_dir / "bench.json", (json.dumps(report, indent=2) + "\n").encode())
    plot(report, ctx.run_dir / "bench_matmul.png")
    return {"rows": rows, "table": table}


def format_table(rows, devices):
    lines = ["| batch x m x k x n | method | devices | median | GFLOP/s | cores used |", "|---|---|---|---|---|---|"]
    for row in rows:
        shape = " x ".join(map(str, row["shape"]))
        for name in METHODS:
            lines.append(f"| {shape} | {name} | {devices[name]} | {row['seconds'][name] * 1e3:.3f} ms "
                         f"| {row['gflops'][name]:.1f} | {row['cores_used'][name]:.2f} |")
    return "\n".join(lines)


def footnote(report):
    notes = [
        f"median of {report['repeats']} repeats after {report['warmup']} warm-up calls; precision "
        f"{report['precision']}; processes: {report['processes']}, {report['platform']} devices per process: "
        f"{report['devices_per_process']}; os.cpu_count() = {report['cpu_count']}, "
        f"sched_getaffinity per rank = {report['sched_getaffinity_per_rank']}.",
        "cores used = process CPU time (user + sys) / wall time over the timed repeats; all processes: "
        "summed over processes, barrier waits excluded.",
        "all processes: the whole batch split over every process (each shards its share over its devices), "
        "barrier before and after each repeat; GFLOP/s over the whole batch.",
        "dispatch only: the timer stops when the call returns, before the work is done; the figure is wrong "
        "on purpose.",
    ]
    if report["platform"] == "cpu":
        notes.append("Emulated CPU devices (--xla_force_host_platform_device_count) are not separate hardware: "
                     "all devices of a process share its cores, and the processes of a node share the node's "
                     "cores. Compare the cores used, not the device counts.")
    else:
        notes.append("cores used counts host CPU threads only (dispatching and waiting), not the device's work.")
    return "\n".join("  " + note for note in notes)


def plot(report, path):
    """GFLOP/s per method per shape (log scale: the dispatch-only bars are off by orders of magnitude)."""
    try:
        from matplotlib.figure import Figure  # a bare Figure: no pyplot global state, no GUI backend
    except ImportError:
        print(f"bench_matmul: matplotlib is not installed (pip install 'jaxlaunch[bench]'); no {path.name}",
              flush=True)
        return
    rows = report["rows"]
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(METHODS)
    for i, name in enumerate(METHODS):
        xs = [j + (i - (len(METHODS) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [row["gflops"][name] for row in rows], width,
               label=f"{name} [{report['devices'][name]}]", hatch="//" if name == DISPATCH else None)
    ax.set_xticks(range(len(rows)), [" x ".join(map(str, row["shape"])) for row in rows])
    ax.set_yscale("log")
    ax.set_xlabel("batch x m x k x n (float32)")
    ax.set_ylabel("GFLOP/s (median)")
    ax.set_title(f"batched matmul, {report['processes']} processes x {report['devices_per_process']} "
                 f"{report['platform']} devices, {report['cpu_count']} CPUs")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_write_bytes(path, buffer.getvalue())
