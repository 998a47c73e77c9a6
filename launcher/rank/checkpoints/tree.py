"""A state's tree as JSON: plain trees (dicts with str keys, lists, tuples, None) are described
in the manifest and come back without `like=`; anything else (namedtuples, custom pytrees) goes
through jax.tree_util and needs `restore(like=...)` to be rebuilt."""

from __future__ import annotations

import sys


class _NotPlain(Exception):
    pass


def is_jax_array(value) -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(value, jax.Array)


def is_leaf(value) -> bool:
    import numpy as np

    return isinstance(value, (int, float, bool, np.ndarray, np.generic)) or is_jax_array(value)


def flatten(state):
    """(paths, leaves, structure); structure is None for trees JSON cannot describe."""
    paths, leaves = [], []

    def walk(node, path):
        if type(node) is dict and all(isinstance(k, str) for k in node):
            return {"dict": [[k, walk(v, f"{path}[{k!r}]")] for k, v in sorted(node.items())]}
        if type(node) in (list, tuple):
            kind = "list" if type(node) is list else "tuple"
            return {kind: [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]}
        if node is None:
            return {"none": True}
        if is_leaf(node):
            paths.append(path)
            leaves.append(node)
            return {"leaf": len(leaves) - 1}
        raise _NotPlain

    try:
        structure = walk(state, "")
        return paths, leaves, structure
    except _NotPlain:
        import jax

        with_paths, _ = jax.tree_util.tree_flatten_with_path(state)
        return [jax.tree_util.keystr(p) for p, _ in with_paths], [leaf for _, leaf in with_paths], None


def unflatten(structure, leaves):
    if "leaf" in structure:
        return leaves[structure["leaf"]]
    if "none" in structure:
        return None
    if "dict" in structure:
        return {k: unflatten(v, leaves) for k, v in structure["dict"]}
    if "list" in structure:
        return [unflatten(v, leaves) for v in structure["list"]]
    return tuple(unflatten(v, leaves) for v in structure["tuple"])
