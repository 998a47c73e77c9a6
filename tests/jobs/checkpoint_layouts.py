"""Checkpoints across layouts, for tests/e2e/test_checkpoint_layouts.py: one state, saved from one
layout of processes x devices and restored onto another, checked bit for bit on every shard.

params:
  action: save | restore | save_loop (saves steps 1, 2, 3 ... until killed)
  folder: the checkpoints folder (outside the run directory, so another run can restore it)
  layout: rows | cols | grid (arrays over a mesh of every device: all processes' devices with
          jax_distributed, else this process's) | data_parallel (every process holds the whole
          state on its local devices, replicated, as an mpi4jax data-parallel job does)
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.rank.checkpoints import Checkpoints


def reference(step=1):
    """The state's values: the same in every process, different at every step."""
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((8, 16)).astype(np.float32),
            "v": rng.standard_normal(16).astype(jnp.bfloat16),
            "e": rng.integers(-1000, 1000, (4, 8)).astype(np.int32),
            "big": rng.standard_normal((1024, 512)).astype(np.float32),  # 2 MiB: replicated parts get split
            "count": 7 * step,
            "rate": np.float64(0.5 * step)}


def shardings(layout: str, local_devices):
    if layout == "data_parallel":
        replicated = NamedSharding(Mesh(np.array(local_devices), ("d",)), P())
        return dict.fromkeys(("w", "v", "e", "big"), replicated)
    devices = np.array(jax.devices())  # every process's devices with jax.distributed
    if layout == "grid":
        mesh = Mesh(devices.reshape(2, -1), ("a", "b"))
        specs = {"w": P("a", "b"), "v": P("b"), "e": P(None, "a"), "big": P("b", "a")}
    else:
        mesh = Mesh(devices, ("m",))
        specs = ({"w": P("m", None), "v": P("m"), "e": P("m"), "big": P("m")} if layout == "rows" else
                 {"w": P(None, "m"), "v": P(), "e": P(None, "m"), "big": P(None, "m")})
    return {name: NamedSharding(mesh, spec) for name, spec in specs.items()}


def build(values, layout, local_devices):
    placed = dict(values)
    for name, sharding in shardings(layout, local_devices).items():
        value = values[name]
        placed[name] = jax.make_array_from_callback(value.shape, sharding, lambda index, v=value: v[index])
    return placed


def mismatches(restored, expected, like, rank):
    """What differs, as text: any shard whose bits differ, or a leaf on another sharding than like's."""
    found = []
    for name, value in expected.items():
        got = restored[name]
        if isinstance(value, np.ndarray):
            if got.sharding != like[name].sharding:
                found.append(f"rank {rank}: {name} on {got.sharding}, not like's {like[name].sharding}")
            for shard in got.addressable_shards:
                if np.asarray(shard.data).tobytes() != value[shard.index].tobytes():
                    found.append(f"rank {rank}: {name}{shard.index} differs")
        elif type(got) is not type(value) or got != value:
            found.append(f"rank {rank}: {name} is {got!r}, not {value!r}")
    return found


def main(ctx):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    action, layout = ctx.params["action"], ctx.params["layout"]
    checkpoints = Checkpoints(ctx.params["folder"], keep=3, rank=ctx.rank, comm=comm.Clone(),
                              devices=ctx.local_devices, mesh=ctx.mesh)
    if action == "save":
        state = build(reference(), layout, ctx.local_devices)
        checkpoints.save(1, state)  # asynchronous: returns with the write still going on
        pending = checkpoints.pending
        busy = jnp.sum(state["w"] @ state["w"].T)  # a step of work while it writes
        folder = checkpoints.wait()
        return {"pending_after_save": comm.allgather(pending), "folder": str(folder), "busy": float(busy)}
    if action == "save_loop":
        with open(os.path.join(ctx.run_dir, f"pid-{ctx.rank}"), "w") as handle:
            handle.write(str(os.getpid()))
        step = checkpoints.latest_step() or 0  # go on from the newest step the last run left
        while True:
            step += 1
            checkpoints.save(step, build(reference(step), layout, ctx.local_devices))
    like = build({k: (np.zeros_like(v) if isinstance(v, np.ndarray) else v) for k, v in reference().items()},
                 layout, ctx.local_devices)
    step, restored = checkpoints.restore(like=like)
    found = comm.allgather(mismatches(restored, reference(step), like, ctx.rank))
    return {"step": step, "mismatches": [m for rank in found for m in rank],
            "shardings": {k: str(getattr(restored[k], "sharding", None)) for k in ("w", "big")}}
