"""Encoding what an entrypoint returns: JSON for plain values, an .npz beside it for arrays.

`load_result(run_dir)` gives back what `write_result` was given, types included. JSON has no
place for some Python values, so they travel as one-key (or two-key) marker objects:

    {"__float__": "nan" | "inf" | "-inf"}          a non-finite float
    {"__complex__": [re, im]}                       a complex number
    {"__tuple__": [...]}                            a tuple (a list stays a list)
    {"__bytes__": "<base64>"}                       bytes
    {"__int__": "<hex>"}                            an int too long for JSON readers (over 4000 digits)
    {"__scalar__": "float32", "value": ...}         a NumPy scalar (or 0-d array) of that dtype; not
                                                    float64, int64 and bool: those are plain JSON
                                                    (PLAIN_SCALARS), as Python's own float/int/bool
    {"__ndarray__": "a0", "shape", "dtype", "path"} an array, stored in result.npz under "a0"
    {"__dict__": [[key, value], ...]}               a dict with a key that is not a string (int,
                                                    float, bool, None, tuple...), each key encoded
                                                    like a value, so its type comes back
    {"__unencodable__": "<type>", "repr", "path"}   a value none of the above can hold

A result with an unencodable value never loses the job's work: result.json is written with that
marker in its place, the whole value is kept with pickle in result.pkl beside it, a warning is
logged, and `load_result` returns the pickled value.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import pickle
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import RunDirectory, atomic_write_bytes
from .names import RESULT_PICKLE, RESULT_SIGNATURE

ARRAY_MARKER = "__ndarray__"
UNENCODABLE = "__unencodable__"
MARKERS = {"__float__", "__complex__", "__tuple__", "__bytes__", "__int__", "__scalar__", ARRAY_MARKER,
           "__dict__", UNENCODABLE}
PICKLE_FILE = RESULT_PICKLE
SIGNATURE_FILE = RESULT_SIGNATURE  # its signature with the owner's key (launcher/owner_key.py)
# NumPy scalars that are JSON's own number and boolean types under another name: written as plain
# JSON (a list of losses reads as a list of floats however each was computed), read back as
# Python float, int and bool. Every other NumPy scalar keeps its dtype in a __scalar__ marker.
PLAIN_SCALARS = {"float64", "int64", "bool"}
_LONG_INT_BITS = 13_000  # about 4000 decimal digits; Python refuses to print ints over 4300 digits

log = logging.getLogger("jaxlaunch.results")


class EncodedResult(NamedTuple):
    value: object                 # JSON-able
    arrays: dict                  # name -> numpy array, for result.npz
    unencodable: list             # (path, type name) of values kept only in result.pkl


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "__array__") and hasattr(value, "shape"))


def dtype_from_name(name: str) -> np.dtype:
    """A dtype from its name, including ml_dtypes' (bfloat16, float8_*, int4...)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))


def _is_ml_dtype(dtype: np.dtype) -> bool:
    return type(dtype.type).__module__.startswith("ml_dtypes") or dtype.type.__module__.startswith("ml_dtypes")


def _float(value: float):
    if math.isfinite(value):
        return value
    return {"__float__": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def _scalar(item: np.generic):
    """{"__scalar__": dtype, "value": ...}, exact for every dtype it accepts; None if none fits."""
    dtype = item.dtype
    kind = dtype.kind
    if _is_ml_dtype(dtype):
        value = _float(float(item)) if "float" in dtype.name else int(item)
    elif kind == "b":
        value = bool(item)
    elif kind in "iu":
        value = int(item)
    elif kind == "f":
        value = (_float(float(item)) if dtype.itemsize <= 8
                 else str(item) if not np.isfinite(item) else np.format_float_scientific(item, unique=True))
    elif kind == "c":
        parts = (item.real, item.imag)
        value = ([_float(float(p)) for p in parts] if dtype.itemsize <= 16
                 else [np.format_float_scientific(p, unique=True) if np.isfinite(p) else str(p) for p in parts])
    elif kind in "mM":
        value = int(item.view(np.int64))
    elif kind == "U":
        value = str(item)
    elif kind == "S":
        value = base64.b64encode(bytes(item)).decode()
    else:
        return None
    return {"__scalar__": dtype.name if _is_ml_dtype(dtype) else dtype.str if kind in "mMUS" else dtype.name,
            "value": value}


def encode_result(value, path: str = "result") -> EncodedResult:
    """(JSON-able value, {name: array}, [(path, type) kept only by pickle]). Never raises for a
    value it cannot hold: it puts an __unencodable__ marker there and reports the path."""
    arrays, unencodable = {}, []

    def unencodable_leaf(item, where, why=""):
        unencodable.append((where, type(item).__name__))
        try:
            text = repr(item)[:200]
        except Exception:  # noqa: BLE001  (a broken __repr__ must not fail the job)
            text = "<no repr>"
        return {UNENCODABLE: type(item).__name__, "repr": text, "path": where, **({"why": why} if why else {})}

    def encode(item, where):
        if isinstance(item, np.generic):  # first: np.float64, np.str_ and np.bytes_ subclass Python types
            if item.dtype.name in PLAIN_SCALARS:
                return encode(item.item(), where)  # JSON's own types: the value is exact, the reader's type natural
            return _scalar(item) or unencodable_leaf(item, where)
        if item is None or isinstance(item, (bool, str)):
            return item
        if isinstance(item, int):
            return {"__int__": hex(item)} if item.bit_length() > _LONG_INT_BITS else int(item)
        if isinstance(item, float):
            return _float(float(item))
        if isinstance(item, complex):
            return {"__complex__": [_float(item.real), _float(item.imag)]}
        if isinstance(item, bytes):
            return {"__bytes__": base64.b64encode(item).decode()}
        if _is_array(item):
            try:
                array = np.asarray(item)
            except Exception as exc:  # noqa: BLE001  (e.g. a PRNG key array)
                return unencodable_leaf(item, where, str(exc))
            if array.dtype.kind in "OV" and not _is_ml_dtype(array.dtype) or array.dtype.fields:
                return unencodable_leaf(item, where, f"dtype {array.dtype} needs pickle")
            if array.ndim == 0:
                return encode(array[()], where)
            name = f"a{len(arrays)}"
            arrays[name] = array
            return {ARRAY_MARKER: name, "shape": list(array.shape), "dtype": array.dtype.name
                    if _is_ml_dtype(array.dtype) else str(array.dtype), "path": where}
        if isinstance(item, dict):
            if all(isinstance(k, str) for k in item) and not MARKERS & set(item):
                return {k: encode(v, f"{where}.{k}") for k, v in item.items()}
            return {"__dict__": [[encode(k, f"{where}.<key {k!r}>"), encode(v, f"{where}[{k!r}]")]
                                 for k, v in item.items()]}
        if isinstance(item, tuple):
            return {"__tuple__": [encode(v, f"{where}[{i}]") for i, v in enumerate(item)]}
        if isinstance(item, list):
            return [encode(v, f"{where}[{i}]") for i, v in enumerate(item)]
        return unencodable_leaf(item, where)

    return EncodedResult(encode(value, path), arrays, unencodable)


def write_result(run_dir: RunDirectory, value) -> list[str]:
    """Write result.json (and result.npz for arrays) atomically; arrays first, so the JSON never
    points at a missing file. Values JSON cannot hold are kept whole in result.pkl; returns the
    warnings it logged (empty when everything was encoded)."""
    encoded, arrays, unencodable = encode_result(value)
    warnings = []
    if unencodable:
        paths = ", ".join(f"{p} ({t})" for p, t in unencodable[:5]) + (" ..." if len(unencodable) > 5 else "")
        try:
            from ..owner_key import sign

            pickled = _pickle(value)
            atomic_write_bytes(run_dir.path / SIGNATURE_FILE, sign(pickled).encode())  # first: never a pkl unsigned
            atomic_write_bytes(run_dir.path / PICKLE_FILE, pickled)
            warnings.append(f"result.json cannot hold {paths}; the whole result is kept in "
                            f"{run_dir.path / PICKLE_FILE} (launcher.load_result reads it)")
        except Exception as exc:  # noqa: BLE001  (keep what can be kept)
            warnings.append(f"result.json cannot hold {paths}, and pickle failed too ({type(exc).__name__}: "
                            f"{exc}); result.json has the rest")
    if arrays:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        atomic_write_bytes(run_dir.arrays_file, buffer.getvalue())
    atomic_write_bytes(run_dir.result_file, (json.dumps(encoded, indent=2, allow_nan=False) + "\n").encode())
    for warning in warnings:
        log.warning("jaxlaunch: %s", warning)
    return warnings


def _pickle(value) -> bytes:
    """cloudpickle: a function job's result may be an instance of a class defined in a notebook,
    which plain pickle can only name, not carry (pickle.loads reads both)."""
    import cloudpickle

    return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class UntrustedResultError(ValueError):
    """result.pkl without its owner's signature: not unpickled."""


class _NeedsPickle(Exception):
    pass


def decode_result(value, arrays):
    """The inverse of encode_result (arrays: the loaded result.npz)."""
    def decode(item):
        if isinstance(item, list):
            return [decode(v) for v in item]
        if not isinstance(item, dict):
            return item
        if "__float__" in item:
            return float(item["__float__"])
        if "__complex__" in item:
            re_, im = (decode(p) for p in item["__complex__"])
            return complex(re_, im)
        if "__tuple__" in item:
            return tuple(decode(v) for v in item["__tuple__"])
        if "__bytes__" in item:
            return base64.b64decode(item["__bytes__"])
        if "__int__" in item:
            return int(item["__int__"], 16)
        if "__scalar__" in item:
            return _decode_scalar(item["__scalar__"], item["value"])
        if ARRAY_MARKER in item:
            array = arrays[item[ARRAY_MARKER]]
            dtype = dtype_from_name(item["dtype"])
            return array.view(dtype) if array.dtype != dtype else array  # bf16 is stored as raw |V2
        if "__dict__" in item:
            return {decode(k): decode(v) for k, v in item["__dict__"]}
        if UNENCODABLE in item:
            raise _NeedsPickle(item.get("path"))
        return {k: decode(v) for k, v in item.items()}

    return decode(value)


def _decode_scalar(name: str, value):
    dtype = dtype_from_name(name)
    kind = dtype.kind
    if kind in "mM":
        return np.array(value, np.int64).view(dtype)[()]
    if kind == "S":
        return np.bytes_(base64.b64decode(value))
    if kind == "c":
        parts = [float(p["__float__"]) if isinstance(p, dict) else p for p in value]
        number = np.zeros((), dtype)
        number.real, number.imag = (np.longdouble(p) if dtype.itemsize > 16 else p for p in parts)
        return number[()]
    if isinstance(value, dict):
        value = float(value["__float__"])
    if kind == "f" and dtype.itemsize > 8:
        return dtype.type(np.longdouble(value))
    return np.array(value, dtype)[()] if not _is_ml_dtype(dtype) else dtype.type(value)


def load_result(run_dir):
    """The value rank 0 returned, with arrays restored from result.npz (dtypes kept, bfloat16
    included). If result.json marks values it could not hold, the whole value comes from
    result.pkl, which jaxlaunch wrote beside it and signed with your key (launcher/owner_key.py):
    an unsigned or changed result.pkl is refused (UntrustedResultError), never unpickled."""
    run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(Path(run_dir))
    value = json.loads(run.result_file.read_text())
    arrays = np.load(run.arrays_file, allow_pickle=False) if run.arrays_file.exists() else {}
    try:
        return decode_result(value, arrays)
    except _NeedsPickle as missing:
        pickled = run.path / PICKLE_FILE
        if not pickled.exists():
            raise ValueError(f"{run.result_file} could not hold {missing} and {pickled} is missing") from None
        from ..owner_key import signed_by_owner

        data = pickled.read_bytes()
        try:
            signature = (run.path / SIGNATURE_FILE).read_text().strip()
        except OSError:
            signature = None
        if not signed_by_owner(data, signature):
            raise UntrustedResultError(
                f"{pickled} is not signed with your key (launcher/owner_key.py): it was not written by a job of "
                f"yours, or was changed since. It is not unpickled (that would run whatever code it holds); "
                f"result.json has the rest of the result") from None
        return pickle.loads(data)
