"""Allreduce benchmark: launcher.allreduce against the baselines, side by side in one run.

Methods (float32 sum across processes, one device per process):
  mpi4py            raw MPI on numpy buffers: the limit
  mpi4jax per-leaf  one jitted mpi4jax.allreduce per array (what a user writes by hand)
  launcher          launcher.allreduce: local reduce, then one fused mpi4jax call per dtype
  launcher packed   the tree packed into one buffer inside the job's own jit (launcher.TreePacker),
                    then launcher.allreduce of that buffer: how a training step should exchange
                    gradients. The pack and unpack ride in jits the step runs anyway; what they add
                    there is measured apart (row field `pack_seconds`) and counted in the ratio.
  XLA global mesh   an XLA collective over a mesh of every device of every process (jax.distributed;
                    gloo on CPU): a psum inside one jit, no launcher code involved

Method: warm-up (and compilation) excluded; every repeat starts after an MPI barrier and ends with
block_until_ready; a repeat's time is the slowest rank's; the figure is the median over repeats.
Writes bench.json and bench.png into the run directory and prints a table.
"""

import json
import time

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from mpi4py import MPI

import launcher
from launcher.rundir import atomic_write_bytes

METHODS = ["mpi4py", "mpi4jax per-leaf", "launcher", "launcher packed", "XLA global mesh"]
WARMUP = 3


def median_seconds(call, repeats, comm):
    for _ in range(WARMUP):
        jax.block_until_ready(call())
    times = np.empty(repeats)
    for i in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        jax.block_until_ready(call())
        times[i] = time.perf_counter() - start
    comm.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # a repeat lasts as long as its slowest rank
    return float(np.median(times))


def repeats_for(nbytes, scale):
    return max(5, int(scale * (200 if nbytes <= 64 << 10 else 40 if nbytes <= 4 << 20 else 10)))


def make_methods(comm, mpi4jax_comm, global_mesh):
    """Each method: leaves (list of local jax arrays) -> a callable doing one allreduce of all of them."""
    per_leaf = jax.jit(lambda x: mpi4jax.allreduce(x, op=MPI.SUM, comm=mpi4jax_comm))
    spec = PartitionSpec("p")
    sharding = NamedSharding(global_mesh, spec)
    psum = jax.jit(jax.shard_map(lambda xs: [jax.lax.psum(x, "p") for x in xs], mesh=global_mesh,
                                 in_specs=spec, out_specs=spec))

    def mpi4py_method(leaves):
        send = np.concatenate([np.asarray(x).ravel() for x in leaves])  # one buffer: the limit
        recv = np.empty_like(send)
        return lambda: comm.Allreduce(send, recv, op=MPI.SUM)

    def per_leaf_method(leaves):
        return lambda: [per_leaf(x) for x in leaves]

    def launcher_method(leaves):
        return lambda: launcher.allreduce(leaves)

    def packed_method(leaves):
        flat = jax.jit(launcher.TreePacker(leaves).pack)(leaves)  # in a job: inside its gradient jit
        return lambda: launcher.allreduce(flat)

    def distributed_method(leaves):
        size = comm.Get_size()
        globals_ = [jax.make_array_from_single_device_arrays((size * x.shape[0],) + x.shape[1:], sharding, [x])
                    for x in leaves]
        return lambda: psum(globals_)

    return dict(zip(METHODS, [mpi4py_method, per_leaf_method, launcher_method, packed_method, distributed_method]))


def pack_seconds(leaves, repeats, comm):
    """What packing adds to a jitted function that produces the tree (a gradient step), plus what
    unpacking adds to one that consumes it (the update): the difference of medians, with and without."""
    packer = launcher.TreePacker(leaves)
    produce = jax.jit(lambda t: [x * 2 for x in t])
    produce_packed = jax.jit(lambda t: packer.pack([x * 2 for x in t]))
    consume = jax.jit(lambda t: [x * 0.5 for x in t])
    consume_packed = jax.jit(lambda flat: [x * 0.5 for x in packer.unpack(flat)])
    flat = produce_packed(leaves)
    plain = median_seconds(lambda: produce(leaves), repeats, comm) + median_seconds(lambda: consume(leaves), repeats, comm)
    packed = median_seconds(lambda: produce_packed(leaves), repeats, comm) + \
        median_seconds(lambda: consume_packed(flat), repeats, comm)
    return max(0.0, packed - plain)


def check_results(leaves, comm, mpi4jax_comm, global_mesh):
    """Every method must compute the same sum before its time means anything."""
    size = comm.Get_size()
    expected = [np.asarray(x) * size for x in leaves]  # every rank contributes the same values here
    fused = launcher.allreduce(leaves)
    for got, want in zip(fused, expected):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    packer = launcher.TreePacker(leaves)
    unpacked = jax.jit(packer.unpack)(launcher.allreduce(jax.jit(packer.pack)(leaves)))
    for got, want in zip(unpacked, expected):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def can_plot(name: str) -> bool:
    """Asked before the work, not after it: without matplotlib the table is all there is."""
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        print(f"{name}: matplotlib is not installed (pip install -e '.[bench]'): the table only, no plot",
              flush=True)
        return False


def main(ctx):
    plotting = can_plot("bench_allreduce") if ctx.is_main else False
    comm = MPI.COMM_WORLD.Clone()
    mpi4jax_comm = MPI.COMM_WORLD.Clone()
    device = ctx.local_devices[0]
    global_mesh = Mesh(np.array(jax.devices()), ("p",))
    methods = make_methods(comm, mpi4jax_comm, global_mesh)
    sizes = [int(s) for s in ctx.params.get("sizes", [8, 1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20])]
    scale = float(ctx.params.get("repeat_scale", 1.0))
    tree_leaves = int(ctx.params.get("tree_leaves", 100))
    tree_bytes = int(ctx.params.get("tree_bytes", 4 << 20))

    cases = [(f"{n} B", n, [jax.device_put(jnp.ones(max(1, n // 4), jnp.float32), device)]) for n in sizes]
    per_leaf = tree_bytes // tree_leaves // 4
    tree = [jax.device_put(jnp.full(per_leaf, i, jnp.float32), device) for i in range(tree_leaves)]
    cases.append((f"{tree_leaves}-leaf tree, {tree_bytes >> 20} MiB", per_leaf * 4 * tree_leaves, tree))

    rows = []
    for label, nbytes, leaves in cases:
        check_results(leaves, comm, mpi4jax_comm, global_mesh)
        repeats = repeats_for(nbytes, scale)
        timings = {name: median_seconds(make(leaves), repeats, comm) for name, make in methods.items()}
        rows.append({"case": label, "bytes": nbytes, "leaves": len(leaves), "repeats": repeats, "seconds": timings,
                     "pack_seconds": pack_seconds(leaves, repeats, comm) if len(leaves) > 1 else 0.0})
        if ctx.is_main:
            print(format_row(rows[-1]), flush=True)

    report = {"processes": ctx.size, "devices_per_process": ctx.num_local_devices, "methods": METHODS,
              "rows": rows, "jax": jax.__version__, "mpi4jax": mpi4jax.__version__,
              "mpi": MPI.Get_library_version().splitlines()[0]}
    if ctx.is_main:
        print(format_table(rows), flush=True)
        atomic_write_bytes(ctx.run_dir / "bench.json", json.dumps(report, indent=2).encode())
        if plotting:
            plot(rows, ctx.run_dir / "bench.png", ctx.size)
    return {"rows": rows, "table": format_table(rows)}


def human_time(seconds):
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def format_row(row):
    return f"{row['case']}: " + ", ".join(f"{m} {human_time(t)}" for m, t in row["seconds"].items())


def format_table(rows):
    header = ("| case | " + " | ".join(METHODS) + " | launcher / mpi4py | packed (+ pack in jit) / mpi4py "
              "| per-leaf / launcher |")
    lines = [header, "|" + "---|" * (len(METHODS) + 4)]
    for row in rows:
        t = row["seconds"]
        packed = (t["launcher packed"] + row.get("pack_seconds", 0.0)) / t["mpi4py"]
        lines.append(f"| {row['case']} | " + " | ".join(human_time(t[m]) for m in METHODS)
                     + f" | {t['launcher'] / t['mpi4py']:.2f}x | {packed:.2f}x"
                     + f" | {t['mpi4jax per-leaf'] / t['launcher']:.1f}x |")
    return "\n".join(lines)


def plot(rows, path, processes):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    singles = [r for r in rows if r["leaves"] == 1]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in METHODS:
        ax.loglog([r["bytes"] for r in singles], [r["seconds"][method] for r in singles], marker="o", label=method)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time per allreduce (s)")
    ax.set_title(f"float32 sum allreduce, {processes} processes, median")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)
