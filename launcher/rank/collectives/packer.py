"""TreePacker: a pytree as one flat buffer, packed and unpacked inside the job's own jit, so that
exchanging a gradient tree is one buffer and one MPI call."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


class TreePacker:
    """Flatten a pytree into ONE buffer inside your own jitted code, and back.

    `launcher.allreduce(tree)` concatenates the leaves itself, outside your jit: for a gradient
    tree of many leaves that is extra dispatches and copies on every step. A packer moves that
    work into the functions the job jits anyway, so the exchange is one buffer and one MPI call:

        packer = launcher.TreePacker(params)              # the structure, shapes and dtype

        @jax.jit
        def grad_step(params, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            return loss, packer.pack(grads)               # (total size,) float32, made inside the jit

        @jax.jit
        def update(params, flat):
            grads = packer.unpack(flat)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

        loss, flat = grad_step(params, x, y)
        params = update(params, launcher.allreduce(flat, op="mean"))

    Under pmap, `pack` gives each device's row and `allreduce` reduces the rows over every device
    of every process, as it does for any per-device leaf. Every leaf must have the same dtype
    (the buffer's); `like` may hold arrays or jax.ShapeDtypeStruct.
    """

    def __init__(self, like):
        leaves, self.treedef = jax.tree_util.tree_flatten(like)
        if not leaves:
            raise ValueError("TreePacker needs a tree with at least one array")
        dtypes = {np.dtype(leaf.dtype) for leaf in leaves}
        if len(dtypes) != 1:
            raise TypeError(f"TreePacker packs leaves of one dtype; this tree has {sorted(map(str, dtypes))}. "
                            "Cast the tree first, or pack each dtype's leaves apart.")
        self.dtype = dtypes.pop()
        self.shapes = [tuple(leaf.shape) for leaf in leaves]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        self.size = sum(self.sizes)

    def pack(self, tree):
        """The leaves, flattened and concatenated (traceable: call it inside jit or pmap)."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self.treedef:
            raise ValueError(f"TreePacker.pack: the tree's structure {treedef} is not the packer's {self.treedef}")
        return jnp.concatenate([jnp.ravel(leaf) for leaf in leaves])

    def unpack(self, flat):
        """The tree back from a buffer `pack` made (traceable)."""
        offsets = np.cumsum([0, *self.sizes])
        leaves = [flat[start:end].reshape(shape) for start, end, shape in zip(offsets[:-1], offsets[1:], self.shapes)]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)
