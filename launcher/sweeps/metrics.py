"""A metric of a sweep's results table: the best configuration (`jaxlaunch results --best`) and a
plot of the metric against the swept keys (`--plot`)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from ..errors import UsageError
from ..rundir import atomic_write_bytes
from .table import SweepTable, is_number


def _numeric_columns(table: SweepTable) -> list[str]:
    return [c for c in table.columns if c != "task" and any(is_number(row.get(c)) for row in table.rows)]


def _metric_values(table: SweepTable, metric: str) -> list[tuple[dict, float]]:
    """(row, value) for the rows with a finite number in `metric`; UsageError if there are none."""
    numeric = _numeric_columns(table)
    if metric not in table.columns:
        raise UsageError(f"no column {metric!r} in the sweep results.\n"
                         f"  fix: pick one of the numeric columns: {', '.join(numeric) or '(none yet)'}.")
    found = [(row, float(row[metric])) for row in table.rows
             if is_number(row.get(metric)) and math.isfinite(row[metric])]
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
    if is_number(value):
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
        order[group] = tuple((0, float(v), "") if is_number(v) else (1, 0.0, _label(v))
                             for v in (row.get(k) for k in group_keys))
    lines = dict(sorted(lines.items(), key=lambda item: order[item[0]]))
    xs = [point[0] for points in lines.values() for point in points]
    numeric_x = all(is_number(v) for v in xs)
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


def plot_curves(sweep_dir, metric: str, path):
    """METRIC against the step, one line per task (its reports in metrics.jsonl), labelled by the
    task's swept values."""
    from matplotlib.figure import Figure

    from ..rundir.metrics import metrics
    from .directory import SweepDirectory

    directory = SweepDirectory(sweep_dir)
    record = directory.read()
    figure = Figure(figsize=(7.5, 4.5))
    axis = figure.subplots()
    drawn = 0
    for task, run in directory.task_runs(record):
        by_step = {r["step"]: r[metric] for r in metrics(run.path) if isinstance(r.get(metric), (int, float))}
        if not by_step:
            continue
        label = ", ".join(f"{k}={task['values'].get(k)}" for k in record["keys"]) if task.get("values") else task["folder"]
        steps = sorted(by_step)
        axis.plot(steps, [by_step[s] for s in steps], label=label, linewidth=1.2)
        drawn += 1
    if not drawn:
        from ..errors import UsageError

        raise UsageError(f"no task of {sweep_dir} reported a number named {metric!r} (ctx.report)")
    axis.set_xlabel("step")
    axis.set_ylabel(metric)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path
