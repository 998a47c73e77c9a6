"""Allreduce benchmark: launcher.allreduce against the baselines, side by side in one run.

Methods (float32 sum across processes, one device per process):
  mpi4py            raw MPI on numpy buffers, out of place (send and receive buffers): the limit
  mpi4py in-place   the same with MPI_IN_PLACE, which launcher.allreduce uses on the CPU: what
                    MPI itself costs there (cheaper than out of place in Open MPI)
  mpi4jax per-leaf  one jitted mpi4jax.allreduce per array (what a user writes by hand)
  launcher          launcher.allreduce of the arrays as they are (a tree of separate device arrays)
  launcher packed   the tree packed into one buffer inside the job's own jit (launcher.TreePacker),
                    then launcher.allreduce of that buffer: how a training step should exchange
                    gradients. The pack and unpack ride in jits the step runs anyway; what they add
                    there is measured apart (row field `pack_seconds`) and counted in the ratio.
  XLA global mesh   an XLA collective over a mesh of every device of every process (jax.distributed;
                    gloo on CPU): a psum inside one jit, no launcher code involved
  launcher (xla)    launcher.allreduce with `transport: xla`: the same call over XLA's collectives
                    instead of mpi4jax (the spec's transport key; here switched per call)
Inside jit (issue 35), for every case: `jit step` is a jitted stand-in for a gradient step that makes
the tree (x * 2 per leaf), `jit step + allreduce` the same jit that also calls launcher.allreduce on
its result. Its target: at most 1.25x (jit step + mpi4py in-place). `jit step + psum (XLA)` is the
same step written for XLA's collectives: one jit over the global mesh, a psum of its result inside
shard_map (no launcher code), the in-jit figure of the XLA transport.
The floor of an allreduce outside jit of a tree of separate arrays (measured in the same run, for
trees): the in-place MPI call, plus gathering the leaves into one buffer (the cheaper of a jitted
concatenate and NumPy's), plus making the result arrays (the cheaper of one jitted split of a
buffer put on the device and one device_put per leaf). Its target: launcher within 1.25x of it.
Then 8-byte calls of every launcher collective against the raw mpi4py call it makes: allreduce,
broadcast and ctx.should_stop().

Method: warm-up (and compilation) excluded; the methods take turns in 5 interleaved blocks (the
first method rotates; the XLA methods are timed apart, after them); every call starts after an
MPI barrier and ends with block_until_ready; each call's result is kept until the next call
replaces it, as a training loop's `grads = allreduce(...)` keeps it (a result dropped at once gives
its memory straight back to the next call, which flatters whoever allocates per call); a call's
time is the slowest rank's; a run's figure is the median over its calls. params.runs runs
(default 5) give the median of the runs' medians and their min-max; ratios are taken within each
run, then summarised the same way. The 1-minute load average before and after is recorded: this
compares CPU work against MPI, so a busy machine skews it (the raw side slows most).
Writes bench.json and bench.png into the run directory and prints the tables.
"""

import json
import os
import time

import jax
import jax.numpy as jnp
import mpi4jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from mpi4py import MPI

import launcher
from launcher.rank.collectives import choice
from launcher.rundir import atomic_write_bytes

METHODS = ["mpi4py", "mpi4py in-place", "mpi4jax per-leaf", "launcher", "launcher packed", "XLA global mesh",
           "launcher (xla)", "jit step", "jit step + allreduce", "jit step + psum (XLA)"]
XLA_METHODS = ["XLA global mesh", "launcher (xla)", "jit step + psum (XLA)"]  # gloo: timed apart, after the rest
FLOOR_PARTS = ["gather (jit)", "gather (numpy)", "make (jit split)", "make (device_put)"]
SMALL_OPS = ["allreduce", "broadcast", "should_stop"]  # 8-byte calls: raw mpi4py vs launcher (and over XLA)
WARMUP = 3
BLOCKS = 5  # interleaved blocks per measurement (see side_by_side)


def side_by_side(calls, repeats, comm, blocks=BLOCKS):
    """{name: median seconds}, in interleaved blocks: the methods take turns (the first one rotates),
    each for about repeats / blocks calls after one untimed call. A block measures each method in
    its steady state; call by call, switching between such different code every time left every
    method 2-4x slower (8 B raw mpi4py: 10.8 us against 2.3 us). The turns spread the machine's
    drift over all methods alike."""
    names = list(calls)
    for name in names:
        for _ in range(WARMUP):
            jax.block_until_ready(calls[name]())
    per_block = max(1, -(-repeats // blocks))
    times = {name: [] for name in names}
    for block in range(blocks):
        for k in range(len(names)):
            name = names[(block + k) % len(names)]  # the same order on every rank
            kept = jax.block_until_ready(calls[name]())
            for _ in range(per_block):
                comm.Barrier()
                start = time.perf_counter()
                kept = jax.block_until_ready(calls[name]())  # the last result lives on, as in a loop
                times[name].append(time.perf_counter() - start)
            del kept
    medians = {}
    for name in names:
        seconds = np.array(times[name])
        comm.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)  # a call lasts as long as its slowest rank
        medians[name] = float(np.median(seconds))
    return medians


def one_by_one(call, repeats, comm):
    """Median seconds of `call` in one block: the XLA global mesh (gloo), timed after the MPI
    methods rather than among them, as this benchmark always did."""
    return side_by_side({"call": call}, repeats, comm, blocks=1)["call"]


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

    def in_place_method(leaves):
        buffer = np.concatenate([np.asarray(x).ravel() for x in leaves])
        return lambda: comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)  # sums grow: only the time counts

    def per_leaf_method(leaves):
        return lambda: [per_leaf(x) for x in leaves]

    def launcher_method(leaves):
        return lambda: launcher.allreduce(leaves)

    def packed_method(leaves):
        flat = jax.jit(launcher.TreePacker(leaves).pack)(leaves)  # in a job: inside its gradient jit
        return lambda: launcher.allreduce(flat)

    def global_arrays(leaves):
        size = comm.Get_size()
        return [jax.make_array_from_single_device_arrays((size * x.shape[0],) + x.shape[1:], sharding, [x])
                for x in leaves]

    def distributed_method(leaves):
        globals_ = global_arrays(leaves)
        return lambda: psum(globals_)

    def launcher_xla_method(leaves):
        def call():
            with choice.using("xla"):
                return launcher.allreduce(leaves)
        return call

    step = jax.jit(lambda t: [x * 2 for x in t])
    step_exchange = jax.jit(lambda t: launcher.allreduce([x * 2 for x in t]))
    step_psum = jax.jit(jax.shard_map(lambda xs: [jax.lax.psum(x * 2, "p") for x in xs], mesh=global_mesh,
                                      in_specs=spec, out_specs=spec))

    def step_psum_method(leaves):
        globals_ = global_arrays(leaves)
        return lambda: step_psum(globals_)

    def step_method(leaves):
        return lambda: step(leaves)

    def step_exchange_method(leaves):
        return lambda: step_exchange(leaves)

    return dict(zip(METHODS, [mpi4py_method, in_place_method, per_leaf_method, launcher_method, packed_method,
                              distributed_method, launcher_xla_method, step_method, step_exchange_method,
                              step_psum_method]))


def floor_parts(leaves, device):
    """The parts of the floor of an allreduce of separate arrays, besides the MPI call: {part: call}."""
    shapes = [x.shape for x in leaves]
    sizes = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
    concat = jax.jit(lambda t: jnp.concatenate([jnp.ravel(x) for x in t]))
    split = jax.jit(lambda flat: [part.reshape(s) for part, s in zip(jnp.split(flat, sizes), shapes)])
    buffer = np.concatenate([np.asarray(x).ravel() for x in leaves])
    return {"gather (jit)": lambda: np.asarray(concat(leaves)),
            "gather (numpy)": lambda: np.concatenate([np.asarray(x).ravel() for x in leaves]),
            "make (jit split)": lambda: split(jax.device_put(buffer, device)),
            "make (device_put)": lambda: [jax.device_put(part.reshape(s), device)
                                          for part, s in zip(np.split(buffer, sizes), shapes)]}


def small_calls(ctx, comm, device):
    """{op: (raw mpi4py call, launcher call)} for 8-byte messages."""
    value = jax.device_put(jnp.ones(2, jnp.float32), device)
    send, recv = np.ones(2, np.float32), np.empty(2, np.float32)
    flag, agreed = np.zeros(1, np.int32), np.zeros(1, np.int32)
    return {"allreduce": (lambda: comm.Allreduce(send, recv, op=MPI.SUM), lambda: launcher.allreduce(value)),
            "broadcast": (lambda: comm.Bcast(recv, root=0), lambda: launcher.broadcast(value)),
            "should_stop": (lambda: comm.Allreduce(flag, agreed, op=MPI.BOR), ctx.should_stop)}


def small_xla_calls(device):
    """{op: launcher call over XLA's collectives} for the same 8-byte messages (timed apart)."""
    value = jax.device_put(jnp.ones(2, jnp.float32), device)

    def over_xla(collective):
        def call():
            with choice.using("xla"):
                return collective(value)
        return call
    return {"allreduce": over_xla(launcher.allreduce), "broadcast": over_xla(launcher.broadcast)}


def pack_seconds(leaves, repeats, comm):
    """What packing adds to a jitted function that produces the tree (a gradient step), plus what
    unpacking adds to one that consumes it (the update): the difference of medians, with and without."""
    packer = launcher.TreePacker(leaves)
    produce = jax.jit(lambda t: [x * 2 for x in t])
    produce_packed = jax.jit(lambda t: packer.pack([x * 2 for x in t]))
    consume = jax.jit(lambda t: [x * 0.5 for x in t])
    consume_packed = jax.jit(lambda flat: [x * 0.5 for x in packer.unpack(flat)])
    flat = produce_packed(leaves)
    t = side_by_side({"produce": lambda: produce(leaves), "produce packed": lambda: produce_packed(leaves),
                      "consume": lambda: consume(leaves), "consume packed": lambda: consume_packed(flat)},
                     repeats, comm)
    return max(0.0, t["produce packed"] + t["consume packed"] - t["produce"] - t["consume"])


def check_results(leaves, comm, mpi4jax_comm, global_mesh):
    """Every method must compute the same sum before its time means anything."""
    size = comm.Get_size()
    expected = [np.asarray(x) * size for x in leaves]  # every rank contributes the same values here
    fused = launcher.allreduce(leaves)
    for got, want in zip(fused, expected):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    with choice.using("xla"):
        over_xla = launcher.allreduce(leaves)
    for got, want in zip(over_xla, expected):
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


def summary(values):
    """Median and min-max of one figure over the runs."""
    return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def main(ctx):
    plotting = can_plot("bench_allreduce") if ctx.is_main else False
    load_before = os.getloadavg()[0]
    comm = MPI.COMM_WORLD.Clone()
    mpi4jax_comm = MPI.COMM_WORLD.Clone()
    device = ctx.local_devices[0]
    global_mesh = Mesh(np.array(jax.devices()), ("p",))
    methods = make_methods(comm, mpi4jax_comm, global_mesh)
    sizes = [int(s) for s in ctx.params.get("sizes", [8, 1 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20])]
    scale = float(ctx.params.get("repeat_scale", 1.0))
    runs = int(ctx.params.get("runs", 5))
    tree_leaves = int(ctx.params.get("tree_leaves", 100))
    tree_bytes = int(ctx.params.get("tree_bytes", 4 << 20))

    cases = [(f"{n} B", n, [jax.device_put(jnp.ones(max(1, n // 4), jnp.float32), device)]) for n in sizes]
    per_leaf = tree_bytes // tree_leaves // 4
    tree = [jax.device_put(jnp.full(per_leaf, i, jnp.float32), device) for i in range(tree_leaves)]
    cases.append((f"{tree_leaves}-leaf tree, {tree_bytes >> 20} MiB", per_leaf * 4 * tree_leaves, tree))
    for _, _, leaves in cases:
        check_results(leaves, comm, mpi4jax_comm, global_mesh)
    calls = {label: {name: make(leaves) for name, make in methods.items()} for label, _, leaves in cases}
    small = small_calls(ctx, comm, device)
    small_xla = small_xla_calls(device)
    small_pairs = {f"{op} {side}": call for op, pair in small.items() for side, call in zip(("mpi4py", "launcher"), pair)}

    per_run = []  # per run: {case: {"seconds": {...}, "pack_seconds": s}}, {op: {"mpi4py": s, "launcher": s}}
    for run in range(runs):
        rows = {}
        for label, nbytes, leaves in cases:
            repeats = repeats_for(nbytes, scale)
            interleaved = {name: call for name, call in calls[label].items() if name not in XLA_METHODS}
            seconds = side_by_side(interleaved, repeats, comm)
            for name in XLA_METHODS:
                seconds[name] = one_by_one(calls[label][name], repeats, comm)
            rows[label] = {"seconds": seconds,
                           "pack_seconds": pack_seconds(leaves, repeats, comm) if len(leaves) > 1 else 0.0}
            if len(leaves) > 1:
                parts = side_by_side(floor_parts(leaves, device), repeats, comm)
                rows[label]["floor_parts"] = parts
                rows[label]["floor_seconds"] = (seconds["mpi4py in-place"] + min(parts["gather (jit)"],
                                                parts["gather (numpy)"]) + min(parts["make (jit split)"],
                                                                               parts["make (device_put)"]))
            if ctx.is_main:
                print(f"run {run + 1}/{runs} " + format_row(label, rows[label]["seconds"]), flush=True)
        timed = side_by_side(small_pairs, repeats_for(8, scale), comm)
        for op, call in small_xla.items():
            timed[f"{op} launcher (xla)"] = one_by_one(call, repeats_for(8, scale), comm)
        per_run.append((rows, {op: {side: timed[f"{op} {side}"] for side in ("mpi4py", "launcher", "launcher (xla)")
                                    if f"{op} {side}" in timed} for op in small}))

    rows = []
    for label, nbytes, leaves in cases:
        seconds = [run_rows[label]["seconds"] for run_rows, _ in per_run]
        packs = [run_rows[label]["pack_seconds"] for run_rows, _ in per_run]
        rows.append({"case": label, "bytes": nbytes, "leaves": len(leaves), "repeats": repeats_for(nbytes, scale),
                     "runs": runs,
                     "seconds": {m: float(np.median([s[m] for s in seconds])) for m in METHODS},
                     "per_run": seconds,
                     "spread": {m: summary([s[m] for s in seconds]) for m in METHODS},
                     "pack_seconds": float(np.median(packs)),
                     "ratios": {"launcher / mpi4py": summary([s["launcher"] / s["mpi4py"] for s in seconds]),
                                "jit step + allreduce / (jit step + in-place)": summary(
                                    [s["jit step + allreduce"] / (s["jit step"] + s["mpi4py in-place"])
                                     for s in seconds]),
                                "launcher / mpi4py in-place": summary([s["launcher"] / s["mpi4py in-place"]
                                                                      for s in seconds]),
                                "launcher (xla) / launcher": summary([s["launcher (xla)"] / s["launcher"]
                                                                     for s in seconds]),
                                "packed (+ pack in jit) / mpi4py": summary(
                                    [(s["launcher packed"] + p) / s["mpi4py"] for s, p in zip(seconds, packs)])}})
    for row, (label, _, leaves) in zip(rows, cases):
        if len(leaves) > 1:
            floors = [run_rows[label]["floor_seconds"] for run_rows, _ in per_run]
            row["floor_seconds"] = summary(floors)
            row["floor_parts"] = {part: float(np.median([run_rows[label]["floor_parts"][part] for run_rows, _ in
                                                         per_run])) for part in FLOOR_PARTS}
            row["ratios"]["launcher / floor"] = summary([run_rows[label]["seconds"]["launcher"] / f
                                                         for (run_rows, _), f in zip(per_run, floors)])
    small_rows = [{"op": op, "bytes": 8, "runs": runs,
                   "mpi4py": summary([t[op]["mpi4py"] for _, t in per_run]),
                   "launcher": summary([t[op]["launcher"] for _, t in per_run]),
                   **({"launcher (xla)": summary([t[op]["launcher (xla)"] for _, t in per_run])}
                      if op in small_xla else {}),
                   "per_run": [t[op] for _, t in per_run]} for op in small]
    load_after = os.getloadavg()[0]
    report = {"processes": ctx.size, "devices_per_process": ctx.num_local_devices, "methods": METHODS,
              "runs": runs, "rows": rows, "small": small_rows,
              "load_average_1min": {"before": load_before, "after": load_after}, "cpus": os.cpu_count(),
              "jax": jax.__version__, "mpi4jax": mpi4jax.__version__,
              "mpi": MPI.Get_library_version().splitlines()[0]}
    table = (format_table(rows) + "\n\n" + format_jit_table(rows) + "\n\n" + format_floor_table(rows) + "\n\n"
             + format_small_table(small_rows) + "\n\n" + format_transport_table(rows, small_rows) + "\n\n"
             + format_conditions(report))
    if ctx.is_main:
        print(table, flush=True)
        atomic_write_bytes(ctx.run_dir / "bench.json", json.dumps(report, indent=2).encode())
        if plotting:
            plot(rows, ctx.run_dir / "bench.png", ctx.size)
    return {"rows": rows, "small": small_rows, "table": table}


def human_time(seconds):
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def with_spread(spread, unit=human_time):
    """`median (min-max)`, or the median alone for one run."""
    if spread["min"] == spread["max"]:
        return unit(spread["median"])
    return f"{unit(spread['median'])} ({unit(spread['min'])}-{unit(spread['max'])})"


def ratio(value):
    return f"{value:.2f}x"


def format_row(label, seconds):
    return f"{label}: " + ", ".join(f"{m} {human_time(t)}" for m, t in seconds.items())


OUTSIDE = METHODS[:7]  # the main table's columns; the jit step's are in format_jit_table


def format_table(rows):
    header = ("| case | " + " | ".join(OUTSIDE) + " | launcher / mpi4py | launcher / mpi4py in-place "
              "| packed (+ pack in jit) / mpi4py | per-leaf / launcher |")
    lines = [header, "|" + "---|" * (len(OUTSIDE) + 5)]
    for row in rows:
        t = row["seconds"]
        lines.append(f"| {row['case']} | " + " | ".join(with_spread(row["spread"][m]) for m in OUTSIDE)
                     + " | " + " | ".join(with_spread(row["ratios"][r], ratio) for r in
                                          ("launcher / mpi4py", "launcher / mpi4py in-place",
                                           "packed (+ pack in jit) / mpi4py"))
                     + f" | {t['mpi4jax per-leaf'] / t['launcher']:.1f}x |")
    return "\n".join(lines)


def format_jit_table(rows):
    lines = ["| case | jit step | jit step + allreduce | mpi4py in-place | with / (step + in-place) (target <= 1.25x) |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['case']} | {with_spread(row['spread']['jit step'])} | "
                     f"{with_spread(row['spread']['jit step + allreduce'])} | "
                     f"{with_spread(row['spread']['mpi4py in-place'])} | "
                     f"{with_spread(row['ratios']['jit step + allreduce / (jit step + in-place)'], ratio)} |")
    return "\n".join(lines)


def format_floor_table(rows):
    lines = ["| case | in-place MPI | gather: jit / numpy | make: jit split / device_put | floor | launcher | "
             "launcher / floor (target <= 1.25x) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "floor_seconds" not in row:
            continue
        p = row["floor_parts"]
        lines.append(f"| {row['case']} | {human_time(row['seconds']['mpi4py in-place'])} | "
                     f"{human_time(p['gather (jit)'])} / {human_time(p['gather (numpy)'])} | "
                     f"{human_time(p['make (jit split)'])} / {human_time(p['make (device_put)'])} | "
                     f"{with_spread(row['floor_seconds'])} | {with_spread(row['spread']['launcher'])} | "
                     f"{with_spread(row['ratios']['launcher / floor'], ratio)} |")
    return "\n".join(lines)


def format_small_table(small_rows):
    lines = ["| 8 B call | mpi4py | launcher | launcher / mpi4py (target <= 5x) | launcher (xla) |",
             "|---|---|---|---|---|"]
    names = {"allreduce": "allreduce", "broadcast": "broadcast", "should_stop": "should_stop()"}
    for row in small_rows:
        xla = with_spread(row["launcher (xla)"]) if "launcher (xla)" in row else "-"
        lines.append(f"| {names[row['op']]} | {with_spread(row['mpi4py'])} | {with_spread(row['launcher'])} | "
                     f"{row['launcher']['median'] / row['mpi4py']['median']:.1f}x | {xla} |")
    return "\n".join(lines)


def format_transport_table(rows, small_rows):
    """The two transports and raw MPI side by side: outside jit (launcher's call over mpi4jax and over
    XLA, and XLA's psum by hand) and inside the step's jit (mpi4jax in a one-device jit; XLA in a jit
    over the global mesh)."""
    lines = ["| case | raw mpi4py | launcher over mpi4jax | launcher over XLA | XLA psum by hand | "
             "in jit: step + launcher (mpi4jax) | in jit: step + psum (XLA) | XLA / mpi4jax (launcher) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        sp = row["spread"]
        lines.append(f"| {row['case']} | {with_spread(sp['mpi4py'])} | {with_spread(sp['launcher'])} | "
                     f"{with_spread(sp['launcher (xla)'])} | {with_spread(sp['XLA global mesh'])} | "
                     f"{with_spread(sp['jit step + allreduce'])} | {with_spread(sp['jit step + psum (XLA)'])} | "
                     f"{with_spread(row['ratios']['launcher (xla) / launcher'], ratio)} |")
    return "\n".join(lines)


def format_conditions(report):
    load = report["load_average_1min"]
    return (f"{report['processes']} processes x {report['devices_per_process']} device, {report['runs']} runs "
            f"(median of run medians, min-max in brackets); 1-min load average {load['before']:.2f} at the start, "
            f"{load['after']:.2f} at the end (this job's own ranks included), on {report['cpus']} CPUs")


def plot(rows, path, processes):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    singles = [r for r in rows if r["leaves"] == 1]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in OUTSIDE:
        ax.loglog([r["bytes"] for r in singles], [r["seconds"][method] for r in singles], marker="o", label=method)
    # Inside the step's jit: what the exchange adds to the step (the step alone subtracted).
    ax.loglog([r["bytes"] for r in singles],
              [max(1e-7, r["seconds"]["jit step + allreduce"] - r["seconds"]["jit step"]) for r in singles],
              marker="s", linestyle="--", label="launcher inside jit (added to the step)")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time per allreduce (s)")
    ax.set_title(f"float32 sum allreduce, {processes} processes, median")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    tmp.replace(path)
