"""Which pieces of each array are written, and by which process.

A leaf's global array is cut into the distinct regions its devices hold (its shards). A region
held by several processes (replicated data) is written once: cut again along its first axis into
one part per holder, and each part goes to the holder with the fewest bytes so far. Every process
computes the same plan from the same shapes and shardings, so no one has to be told what to write.

Process-local state in a multi-process job (an mpi4jax job keeps the same parameters in every
process) counts as held by every process: each writes 1/N of it instead of rank 0 writing it all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Region = tuple  # ((start, stop), ...) per axis; () for a scalar

# Below this, a replicated region is not cut: a piece per process costs more than it saves.
SPLIT_BYTES = 1 << 20


@dataclass
class Piece:
    leaf: int           # index of the leaf in the flattened state
    region: Region      # where the piece sits in the leaf's global array
    writer: int         # the process that writes it


@dataclass
class LeafShards:
    """What planning needs to know of one leaf: its global shape, bytes per element, and each
    distinct region with the processes that hold it."""
    shape: tuple
    itemsize: int
    regions: list       # [(region, holders)], holders a sorted tuple of process indices


def normalize(index, shape) -> Region:
    """A tuple of slices (as JAX gives a shard's index) as ((start, stop), ...)."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
    return tuple((s.start or 0, dim if s.stop is None else s.stop) for s, dim in zip(index, shape))


def whole(shape) -> Region:
    return tuple((0, dim) for dim in shape)


def size_of(region: Region) -> int:
    return math.prod(stop - start for start, stop in region)


def shape_of(region: Region) -> tuple:
    return tuple(stop - start for start, stop in region)


def intersect(a: Region, b: Region) -> Region | None:
    both = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return None if any(start >= stop for start, stop in both) else both


def relative(inner: Region, outer: Region) -> tuple:
    """Slices that pick `inner` out of an array holding `outer`."""
    return tuple(slice(i0 - o0, i1 - o0) for (i0, i1), (o0, _) in zip(inner, outer))


def split(region: Region, parts: int) -> list[Region]:
    """`region` cut into at most `parts` near-equal slabs along its first axis longer than 1
    (the first such axis keeps each slab contiguous in memory)."""
    axis = next((i for i, (start, stop) in enumerate(region) if stop - start > 1), None)
    if axis is None or parts <= 1:
        return [region]
    start, stop = region[axis]
    parts = min(parts, stop - start)
    bounds = [start + (stop - start) * k // parts for k in range(parts + 1)]
    return [region[:axis] + ((lo, hi),) + region[axis + 1:] for lo, hi in zip(bounds, bounds[1:])]


def plan(leaves: list[LeafShards], processes: int) -> list[Piece]:
    """Every piece of every leaf and its writer, the same in every process."""
    written = [0] * processes
    pieces = []
    for number, leaf in enumerate(leaves):
        for region, holders in sorted(leaf.regions):
            nbytes = size_of(region) * leaf.itemsize
            parts = split(region, len(holders)) if len(holders) > 1 and nbytes >= SPLIT_BYTES else [region]
            for part in parts:
                writer = min(holders, key=lambda p: (written[p], p))
                written[writer] += size_of(part) * leaf.itemsize
                pieces.append(Piece(number, part, writer))
    return pieces


def shards_of(value, processes: int) -> list:
    """[(region, holders)] of one leaf. Arrays over a global mesh: the processes whose devices
    hold each region. Anything else: held by every process (replicated by convention)."""
    everyone = tuple(range(processes))
    shape = tuple(getattr(value, "shape", ()))
    sharding = getattr(value, "sharding", None)
    if sharding is None or not hasattr(value, "addressable_shards"):
        return [(whole(shape), everyone)]
    holders: dict = {}
    for device, index in sharding.devices_indices_map(shape).items():
        holders.setdefault(normalize(index, shape), set()).add(device.process_index)
    if value.is_fully_addressable:
        return [(region, everyone) for region in holders]
    return [(region, tuple(sorted(who))) for region, who in holders.items()]


# --- shardings in the manifest, and back ------------------------------------------------

def describe_sharding(array, local_devices) -> dict:
    """Enough to rebuild the layout without `like=`. Global arrays: the mesh's axes, shape, spec
    and devices as positions in jax.devices(). Process-local ones: positions in the local devices.
    A layout this cannot describe is saved all the same; restoring it then needs `like=`."""
    import jax
    from jax.sharding import NamedSharding, SingleDeviceSharding

    sharding = array.sharding
    is_global = not array.is_fully_addressable
    devices = list(jax.devices() if is_global else local_devices)
    if isinstance(sharding, SingleDeviceSharding):
        device = next(iter(sharding.device_set))
        return {"type": "single", "device": devices.index(device) if device in devices else 0}
    if isinstance(sharding, NamedSharding) and hasattr(sharding.mesh, "devices"):
        mesh = sharding.mesh
        if all(d in devices for d in mesh.devices.flat):
            return {"type": "named", "global": is_global, "axes": list(mesh.axis_names),
                    "mesh_shape": list(mesh.devices.shape), "devices": [devices.index(d) for d in mesh.devices.flat],
                    "spec": [list(p) if isinstance(p, tuple) else p for p in sharding.spec]}
    if sharding.is_fully_replicated and not is_global:
        return {"type": "replicated"}
    return {"type": "other", "text": str(sharding)}


def sharding_from_description(description: dict, local_devices, mesh, path: str):
    """The sharding a leaf saved with `description` gets on this job's devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

    kind = description.get("type", "single")
    if kind == "named":
        devices = list(jax.devices() if description.get("global") else local_devices)
        needed = description["devices"]
        if max(needed) >= len(devices):
            where = "in the job" if description.get("global") else "in this process"
            raise ValueError(f"leaf {path} was saved on a mesh of {len(needed)} devices and this job has "
                             f"{len(devices)} {where}; pass restore(like=state) with the new layout")
        grid = np.array([devices[i] for i in needed]).reshape(description["mesh_shape"])
        spec = [tuple(p) if isinstance(p, list) else p for p in description["spec"]]
        return NamedSharding(Mesh(grid, tuple(description["axes"])), PartitionSpec(*spec))
    if kind == "replicated":
        mesh = mesh if mesh is not None else Mesh(np.array(local_devices), ("devices",))
        return NamedSharding(mesh, PartitionSpec())
    if kind == "single":
        return SingleDeviceSharding(local_devices[min(description.get("device", 0), len(local_devices) - 1)])
    raise ValueError(f"leaf {path} was saved with a layout the manifest cannot describe "
                     f"({description.get('text')}); pass restore(like=state)")
