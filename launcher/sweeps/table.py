"""`jaxlaunch results SWEEP_DIR`: every task of a sweep in one table, with what it returned so far.

A row per task: its index, the swept values, its state, how long it ran, then the scalar parts
of its result (top-level numbers, booleans and short strings; arrays, lists and nested dicts are
left out). Tasks still pending or running show their state and blanks, and one task whose
result cannot be read never hides the others. The table is printed (`format_table`), written
(`write_csv`, `write_json`), searched (`best`) and plotted (`plot`); none of these know click.
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

from ..errors import UsageError
from ..results import load_result
from ..rundir import RunDirectory, atomic_write_bytes
from .directory import SWEEP_FILE

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


def read_sweep(sweep_dir) -> dict:
    """sweep.json as a dict, with `keys` and `tasks` checked; UsageError if it is missing or broken."""
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        sweep = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no {SWEEP_FILE}).\n"
                         f"  fix: pass the folder that `jaxlaunch run` or `jaxlaunch submit` with --sweep printed, "
                         f"the one holding {SWEEP_FILE} and task-000/, task-001/, ...") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read: {exc}.\n"
                         f"  fix: it is written by jaxlaunch when the sweep starts; if it was edited by hand, "
                         f"restore it (it lists the swept keys and one entry per task).") from None
    tasks = sweep.get("tasks") if isinstance(sweep, dict) else None
    if not isinstance(tasks, list) or not all(isinstance(t, dict) for t in tasks):
        raise UsageError(f"{path} has no list of tasks.\n"
                         f"  fix: it is written by jaxlaunch when the sweep starts; if it was edited by hand, "
                         f"restore it (\"tasks\": [{{\"index\": 0, \"folder\": \"task-000\", \"values\": ...}}]).")
    keys = sweep.get("keys")
    if not isinstance(keys, list):  # older or hand-written files: the keys of the first task, in order
        keys = list(tasks[0].get("values", {})) if tasks else []
    return {**sweep, "keys": [str(k) for k in keys], "tasks": tasks}


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
    sweep = read_sweep(sweep_dir)
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
            state = str(status.get("state") or "PENDING")
        except (OSError, ValueError) as exc:
            status, state = {}, "UNKNOWN"
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


def _is_number(value) -> bool:
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
        aligns.append("right" if present and all(_is_number(v) for v in present) else "left")
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


def _numeric_columns(table: SweepTable) -> list[str]:
    return [c for c in table.columns if c != "task" and any(_is_number(row.get(c)) for row in table.rows)]


def _metric_values(table: SweepTable, metric: str) -> list[tuple[dict, float]]:
    """(row, value) for the rows with a finite number in `metric`; UsageError if there are none."""
    numeric = _numeric_columns(table)
    if metric not in table.columns:
        raise UsageError(f"no column {metric!r} in the sweep results.\n"
                         f"  fix: pick one of the numeric columns: {', '.join(numeric) or '(none yet)'}.")
    found = [(row, float(row[metric])) for row in table.rows
             if _is_number(row.get(metric)) and math.isfinite(row[metric])]
    if not found:
        states = sorted({row["state"] for row in table.rows})
        raise UsageError(f"no task has a finite number in column {metric!r} yet "
                         f"(task states: {', '.join(states) or 'no tasks'}).\n"
                         f"  fix: wait for tasks to complete, or pick one of the numeric columns: "
                         f"{', '.join(numeric) or '(none yet)'}.")
    return found


def best(table: SweepTable, metric: str, minimize: bool = True) -> dict:
    """The row with the smallest (largest if not `minimize`) finite value of `metric`; the first
    such task on a tie. Rows without the metric (running, failed, NaN) are ignored."""
    found = _metric_values(table, metric)
    choose = min if minimize else max
    return choose(found, key=lambda item: item[1])[0]


def _label(value) -> str:
    """A swept value as a legend or tick label: 0.001, true, "adam" without quotes, [2, 4]."""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return format(value, ".6g")
    if _is_number(value):
        return str(value)
    return json.dumps(value)


def _check_swept(table: SweepTable, option: str, key: str) -> None:
    if key not in table.keys:
        raise UsageError(f"{option} {key!r} is not a swept key.\n"
                         f"  fix: pick one of the swept keys: {', '.join(table.keys) or '(none)'}.")


def plot(table: SweepTable, metric: str, path, x: str | None = None, by: str | None = None) -> Path:
    """A PNG of `metric` against the swept key `x` (default: the first), one line per value of
    the swept key `by` (default: the next one, if any) and of any swept keys left over. Points
    are sorted by x; rows without a finite metric are skipped; x is logarithmic when its values
    are all positive and span more than a factor of 20."""
    if not table.keys:
        raise UsageError("the sweep has no swept keys to plot against.\n  fix: check its sweep.json.")
    x = table.keys[0] if x is None else x
    _check_swept(table, "x", x)
    if by is None:
        by = next((k for k in table.keys if k != x), None)
    elif by == x:
        raise UsageError(f"by {by!r} is also x.\n  fix: pick another swept key for by: "
                         f"{', '.join(k for k in table.keys if k != x) or '(there is none)'}.")
    else:
        _check_swept(table, "by", by)
    found = _metric_values(table, metric)
    group_keys = ([by] if by else []) + [k for k in table.keys if k not in (x, by)]

    lines: dict[tuple, list] = {}  # group label parts -> [(x, y)]
    order: dict[tuple, tuple] = {}  # group label parts -> how it sorts: by value, numbers first
    for row, y in found:
        group = tuple(f"{k}={_label(row.get(k))}" for k in group_keys)
        lines.setdefault(group, []).append((row.get(x), y))
        order[group] = tuple((0, float(v), "") if _is_number(v) else (1, 0.0, _label(v))
                             for v in (row.get(k) for k in group_keys))
    lines = dict(sorted(lines.items(), key=lambda item: order[item[0]]))
    xs = [point[0] for points in lines.values() for point in points]
    numeric_x = all(_is_number(v) for v in xs)
    # x values that are not all numbers (optimizer names, ...) become evenly spaced ticks, in one
    # sorted order shared by every line
    ticks = sorted({_label(v) for v in xs}) if not numeric_x else []

    try:  # no pyplot: a bare Figure draws with Agg and leaves the user's backend and pyplot state alone
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plotting needs matplotlib, which is not installed.\n"
                         "  fix: pip install matplotlib (or jaxlaunch[bench]).") from None

    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for group, points in lines.items():
        px = [float(p[0]) if numeric_x else ticks.index(_label(p[0])) for p in points]
        ordered = sorted(zip(px, (p[1] for p in points)))
        axes.plot([p[0] for p in ordered], [p[1] for p in ordered], marker="o", label=", ".join(group) or metric)
    if numeric_x and min(xs) > 0 and max(xs) / min(xs) > 20:
        axes.set_xscale("log")
    if ticks:
        axes.set_xticks(range(len(ticks)), ticks)
    axes.set_xlabel(x)
    axes.set_ylabel(metric)
    axes.set_title(f"{table.name}: {metric} against {x}" if table.name else f"{metric} against {x}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue())
    return path
