"""`jaxlaunch results SWEEP_DIR`: every task of a sweep in one table, with what it returned so far.

A row per task: its index, the swept values, its state, how long it ran, then the scalar parts
of its result (top-level numbers, booleans and short strings; arrays, lists and nested dicts are
left out). Tasks still pending or running show their state and blanks, and one task whose
result cannot be read never hides the others. The table is printed (`format_table`) and written
(`write_csv`, `write_json`); metrics.py searches it (`best`) and plots it. None of these know click.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..rundir.results import load_result
from ..rundir import RunDirectory, atomic_write_bytes
from .directory import SweepDirectory
from ..states import JobState

MAX_STRING = 40          # longer strings (paths, messages) would make the table unreadable
RESULT_COLUMN = "result"  # the column of a result that is a scalar rather than a dict
_FIXED = ("task", "state", "seconds")


@dataclass
class SweepTable:
    """`rows` hold every column (None where a task has no value yet), in task order."""

    columns: list[str]
    rows: list[dict]
    keys: list[str] = field(default_factory=list)      # the swept keys, as sweep.json names them
    name: str = ""                                     # the sweep's name, for titles
    warnings: list[str] = field(default_factory=list)  # tasks whose files could not be read, and why


def _scalar(value):
    """The value as a Python bool/int/float/str if it belongs in the table, else None."""
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            return None
        value = value[()]
    if isinstance(value, np.generic):
        kind, name = value.dtype.kind, value.dtype.name
        if kind == "b":
            return bool(value)
        if kind in "iu" or name.startswith(("int", "uint")):  # the latter: ml_dtypes' int4, uint4
            return int(value)
        if kind == "f" or "float" in name:                      # the latter: bfloat16, float8_*
            return float(value)
        if kind == "U":
            value = str(value)
        else:
            return None  # complex, datetime, bytes: no single number to show
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str) and len(value) <= MAX_STRING:
        return str(value)
    return None


def _scalars(result) -> dict:
    if isinstance(result, dict):
        found = {}
        for key, value in result.items():
            scalar = _scalar(value) if isinstance(key, str) else None
            if scalar is not None:
                found[key] = scalar
        return found
    scalar = _scalar(result)
    return {} if scalar is None else {RESULT_COLUMN: scalar}


def _seconds(status: dict):
    started, ended = status.get("started"), status.get("ended")
    if not all(isinstance(t, numbers.Real) and not isinstance(t, bool) for t in (started, ended)):
        return None
    return round(float(ended) - float(started), 1)


def collect(sweep_dir) -> SweepTable:
    """One row per task of the sweep in `sweep_dir`, in index order, from what is on disk now."""
    sweep_dir = Path(sweep_dir)
    sweep = SweepDirectory(sweep_dir).read()
    keys = sweep["keys"]
    taken = set(_FIXED) | set(keys)
    result_columns: dict[str, str] = {}  # result key -> column name, first seen first
    rows, warnings = [], []
    tasks = sorted(enumerate(sweep["tasks"]), key=lambda it: (it[1].get("index", it[0]), it[0]))
    for position, task in tasks:
        index = task.get("index", position)
        run = RunDirectory(sweep_dir / str(task.get("folder") or f"task-{index:03d}"))
        try:
            status = run.read_status()
            state = str(status.get("state") or JobState.PENDING.value)
        except (OSError, ValueError) as exc:
            status, state = {}, JobState.UNKNOWN.value
            warnings.append(f"task {index}: {run.status_file} cannot be read ({exc})")
        values = task.get("values") or {}
        row = {"task": index, **{key: values.get(key) for key in keys}, "state": state, "seconds": _seconds(status)}
        if run.result_file.exists():
            try:
                scalars = _scalars(load_result(run))
            except Exception as exc:  # noqa: BLE001  (one broken task must not hide the others)
                scalars = {}
                warnings.append(f"task {index}: {run.result_file} cannot be read ({type(exc).__name__}: {exc})")
            for key, value in scalars.items():
                if key not in result_columns:
                    # a result key named like a fixed or swept column (e.g. "state") gets a prefix
                    result_columns[key] = f"result.{key}" if key in taken else key
                row[result_columns[key]] = value
        rows.append(row)
    columns = ["task", *keys, "state", "seconds", *result_columns.values()]
    rows = [{column: row.get(column) for column in columns} for row in rows]
    return SweepTable(columns=columns, rows=rows, keys=list(keys), name=str(sweep.get("name") or ""),
                      warnings=warnings)


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return format(value, ".6g")
    return str(value)


def format_table(table: SweepTable) -> str:
    """The table for a terminal: floats with up to 6 significant digits, blanks where no value,
    numeric columns right-aligned."""
    from tabulate import tabulate

    aligns = []
    for column in table.columns:
        present = [row[column] for row in table.rows if row.get(column) is not None]
        aligns.append("right" if present and all(is_number(v) for v in present) else "left")
    cells = [[_cell(row.get(column)) for column in table.columns] for row in table.rows]
    # the cells are already text: numparse would turn a string result like "1e5" into a number
    return tabulate(cells, headers=table.columns, colalign=aligns, disable_numparse=True)


def write_csv(table: SweepTable, path) -> Path:
    """A CSV file with the columns as header; missing values are empty cells, floats at full precision."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in table.columns])
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue().encode())
    return path


def finite_for_json(value):
    """JSON has no NaN or infinity: a non-finite float becomes null (read it as "no usable value")."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_for_json(v) for v in value]
    return value


def write_json(table: SweepTable, path) -> Path:
    """{"columns": [...], "rows": [{column: value}, ...]}, strict JSON: NaN and infinities are
    written as null, like a missing value, so any JSON reader accepts the file."""
    document = {"columns": list(table.columns),
                "rows": [{c: finite_for_json(row.get(c)) for c in table.columns} for row in table.rows]}
    path = Path(path)
    atomic_write_bytes(path, (json.dumps(document, indent=2, allow_nan=False) + "\n").encode())
    return path
