"""Results round-trip: load_result(write_result(x)) == x, types and dtypes included; a result JSON
cannot hold is kept whole in result.pkl instead of failing the job after its compute."""

import json
import logging
import math

import ml_dtypes
import numpy as np
import pytest

from launcher.rundir.results import PLAIN_SCALARS, encode_result, load_result, write_result
from launcher.rundir import RunDirectory

PICKLE_FILE = "result.pkl"  # documented in launcher/rundir/results.py (and so in docs/reference/files.md)


def same(a, b) -> bool:
    """Equal, with the same type (and dtype), NaN equal to NaN, dict keys in order with their types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and bool(a == b or (a != a and b != b))
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, complex):
        return same(a.real, b.real) and same(a.imag, b.imag)
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(ka, kb) and same(a[ka], b[kb]) for ka, kb in zip(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def round_trip(tmp_path, value):
    run = RunDirectory(tmp_path)
    assert write_result(run, value) == []  # no warning: everything was encoded
    assert not (tmp_path / PICKLE_FILE).exists()
    json.loads(run.result_file.read_text())  # strict JSON: no NaN/Infinity tokens
    assert "NaN" not in run.result_file.read_text() and "Infinity" not in run.result_file.read_text()
    return load_result(tmp_path)


def numpy_scalars():
    """One scalar of every NumPy dtype that keeps its __scalar__ marker (PLAIN_SCALARS: below)."""
    out = {}
    for code in np.typecodes["All"]:
        dtype = np.dtype(code)
        if dtype.kind in "OV" or dtype.name in PLAIN_SCALARS:
            continue
        if dtype.kind in "mM":
            dtype = np.dtype(dtype.kind + "8[ms]")
            out[f"{dtype}"] = np.array(-123456789, np.int64).view(dtype)[()]
            out[f"{dtype}-nat"] = dtype.type("NaT")
        elif dtype.kind == "U":
            out["str"] = np.str_("hé\udcff")
        elif dtype.kind == "S":
            out["bytes"] = np.bytes_(b"\x00a\xff")
        elif dtype.kind == "b":
            out["bool"] = np.True_
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            out[f"{dtype}-min"], out[f"{dtype}-max"] = dtype.type(info.min), dtype.type(info.max)
        elif dtype.kind == "f":
            out[f"{dtype}"] = (dtype.type(1) / dtype.type(3))
            out[f"{dtype}-nan"], out[f"{dtype}-inf"] = dtype.type("nan"), dtype.type("-inf")
        elif dtype.kind == "c":
            out[f"{dtype}"] = dtype.type(1) / dtype.type(3) + dtype.type(1j) * dtype.type(-2)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "int4", "uint4"):
        kind = getattr(ml_dtypes, name)
        out[name] = kind(1.5) if "float" in name else kind(-3 if name == "int4" else 7)
    return out


CASES = {
    "non-finite floats": {"nan": float("nan"), "inf": math.inf, "-inf": -math.inf, "list": [math.nan, 1.0]},
    "complex": {"c": 1 + 2j, "odd": complex(math.nan, -math.inf), "top": [3j]},
    "non-string keys": {1: "int", 2.5: "float", False: "bool", None: "none", (1, ("a", 2)): "tuple",
                        "s": {3: {4: [5]}}, -0.0 + 7: "float again"},
    "tuples and lists": ((1, [2, (3,)]), [(), []]),
    "bytes and long ints": {"b": b"\x00\xff", "big": 7 ** 20000, "neg": -(10 ** 5000)},
    "marker-like keys": {"__float__": "nan", "__ndarray__": "a0", "__dict__": []},
    "numpy scalars": numpy_scalars(),
    "0-d arrays become scalars of their dtype": np.array(2.5, np.float32)[()],
    "top-level scalar": np.float16(0.1),
}


@pytest.mark.parametrize("value", CASES.values(), ids=CASES.keys())
def test_round_trip_keeps_values_and_types(tmp_path, value):
    back = round_trip(tmp_path, value)
    assert same(value, back), (value, back)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, np.complex64,
                                   np.dtype("M8[s]"), np.dtype("<U3"), np.bool_, np.uint64])
def test_arrays_keep_their_dtype(tmp_path, dtype):
    """bfloat16 arrays used to come back as raw |V2 bytes."""
    array = np.arange(6).reshape(2, 3).astype(dtype)
    back = round_trip(tmp_path, {"a": array, "nested": [array[0]]})
    assert back["a"].dtype == np.dtype(dtype) and same(array, back["a"]) and same(array[0], back["nested"][0])


def test_jax_arrays_come_back_as_numpy_with_their_dtype(tmp_path):
    import jax.numpy as jnp
    back = round_trip(tmp_path, {"bf16": jnp.ones((2, 2), jnp.bfloat16), "loss": jnp.float32(0.25)})
    assert back["bf16"].dtype == ml_dtypes.bfloat16 and back["bf16"].shape == (2, 2)
    assert type(back["loss"]) is np.float32 and back["loss"] == 0.25


def test_documented_markers_in_result_json(tmp_path):
    run = RunDirectory(tmp_path)
    write_result(run, {"nan": math.nan, "c": 1j, 1: "x"})
    raw = json.loads(run.result_file.read_text())
    assert raw == {"__dict__": [["nan", {"__float__": "nan"}], ["c", {"__complex__": [0.0, 1.0]}], [1, "x"]]}


def test_a_value_json_cannot_hold_is_kept_with_pickle_and_said_so(tmp_path, caplog):
    run = RunDirectory(tmp_path)
    value = {"loss": 0.5, "weights": np.ones(3), "seen": {1, 2}, "deep": [frozenset("a")]}
    with caplog.at_level(logging.WARNING, logger="launcher.rundir.results"):
        warnings = write_result(run, value)
    assert warnings == [f"result.json cannot hold result.seen (set), result.deep[0] (frozenset); the whole "
                        f"result is kept in {tmp_path / PICKLE_FILE} (launcher.load_result reads it)"]
    assert warnings[0] in caplog.text
    raw = json.loads(run.result_file.read_text())
    assert raw["loss"] == 0.5 and raw["seen"] == {"__unencodable__": "set", "repr": "{1, 2}", "path": "result.seen"}
    back = load_result(tmp_path)
    assert back["seen"] == {1, 2} and back["deep"] == [frozenset("a")] and same(back["weights"], np.ones(3))


def test_unpicklable_value_still_writes_the_rest(tmp_path):
    import threading

    run = RunDirectory(tmp_path)
    warnings = write_result(run, {"loss": 0.5, "lock": threading.Lock()})
    assert "pickle failed too" in warnings[0]
    assert json.loads(run.result_file.read_text())["loss"] == 0.5
    with pytest.raises(ValueError, match="could not hold result.lock"):
        load_result(tmp_path)


def test_a_function_or_a_class_made_in_a_notebook_comes_back_through_cloudpickle(tmp_path):
    """A function job's value may be a lambda or an instance of a class defined in __main__, which plain
    pickle can only name, not carry."""
    from dataclasses import dataclass

    @dataclass
    class Point:  # local: pickle could not find it by name
        x: float

    run = RunDirectory(tmp_path)
    write_result(run, {"scale": lambda v: 2 * v, "where": Point(1.5)})
    back = load_result(tmp_path)
    assert back["scale"](3) == 6 and back["where"].x == 1.5


def test_float64_int64_and_bool_scalars_are_plain_json_read_back_as_python_values(tmp_path):
    """A list of losses reads as a list of floats, whether each came from float() or NumPy (a
    resumed job's restored losses are np.float64): jq or pandas must see no difference."""
    value = {"losses": [1.5, np.float64(2.5), np.array(0.25)], "best": np.int64(3), "ok": np.bool_(True),
             "bad": np.float64("nan")}
    text = json.dumps(encode_result(value).value)
    assert "__scalar__" not in text
    assert json.loads(text) == {"losses": [1.5, 2.5, 0.25], "best": 3, "ok": True, "bad": {"__float__": "nan"}}
    back = round_trip(tmp_path, value)
    assert back["losses"] == [1.5, 2.5, 0.25] and all(type(x) is float for x in back["losses"])
    assert type(back["best"]) is int and back["ok"] is True and math.isnan(back["bad"])


@pytest.mark.parametrize("value", [np.float32(0.1), np.float16(1 / 3), ml_dtypes.bfloat16(1.5), np.int8(-3),
                                   np.int32(7), np.uint64(2 ** 64 - 1), np.complex128(1 + 2j), np.float64(1)
                                   .astype(np.longdouble)], ids=str)
def test_scalars_that_json_would_change_keep_their_marker_and_round_trip(tmp_path, value):
    assert encode_result(value).value["__scalar__"] == value.dtype.name
    assert same(value, round_trip(tmp_path, value))
