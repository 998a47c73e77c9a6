"""Encoding what an entrypoint returns: JSON for plain values, an .npz beside it for arrays."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np

from .rundir import RunDirectory, atomic_write_bytes

ARRAY_MARKER = "__ndarray__"


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "__array__") and hasattr(value, "shape"))


def encode_result(value, path="result"):
    """(JSON-able value, {name: array}); arrays with ndim >= 1 move to the arrays dict."""
    arrays = {}

    def encode(item, where):
        if item is None or isinstance(item, (bool, int, str)):
            return item
        if isinstance(item, float):
            return item if math.isfinite(item) else repr(item)
        if isinstance(item, np.generic):
            return encode(item.item(), where)
        if _is_array(item):
            array = np.asarray(item)
            if array.ndim == 0:
                return encode(array.item(), where)
            name = f"a{len(arrays)}"
            arrays[name] = array
            return {ARRAY_MARKER: name, "shape": list(array.shape), "dtype": str(array.dtype), "path": where}
        if isinstance(item, dict):
            bad = [k for k in item if not isinstance(k, str)]
            if bad:
                raise TypeError(f"{where} has a non-string key {bad[0]!r}; result keys must be strings")
            return {k: encode(v, f"{where}.{k}") for k, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [encode(v, f"{where}[{i}]") for i, v in enumerate(item)]
        raise TypeError(f"{where} is a {type(item).__name__}; return JSON-able values (dict, list, str, "
                        f"numbers) or arrays")

    return encode(value, path), arrays


def write_result(run_dir: RunDirectory, value) -> None:
    """Write result.json (and result.npz for arrays) atomically; arrays first, so the JSON never
    points at a missing file."""
    encoded, arrays = encode_result(value)
    if arrays:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write_bytes(run_dir.arrays_file, buffer.getvalue())
    atomic_write_bytes(run_dir.result_file, (json.dumps(encoded, indent=2) + "\n").encode())


def load_result(run_dir):
    """The value rank 0 returned, with arrays restored from result.npz."""
    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(Path(run_dir))
    value = json.loads(run.result_file.read_text())
    arrays = np.load(run.arrays_file) if run.arrays_file.exists() else {}

    def decode(item):
        if isinstance(item, dict):
            if ARRAY_MARKER in item:
                return arrays[item[ARRAY_MARKER]]
            return {k: decode(v) for k, v in item.items()}
        if isinstance(item, list):
            return [decode(v) for v in item]
        return item

    return decode(value)
