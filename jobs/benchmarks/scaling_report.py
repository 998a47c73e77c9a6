"""Strong- and weak-scaling efficiency from a sweep of jobs/benchmarks/scaling.yaml.

    .venv/bin/python jobs/benchmarks/scaling_report.py SWEEP_DIR

Reads every task's result (launcher.load_result), pairs each N-process configuration with the
1-process one of the same mode, and computes, with T(N) the median step time on N processes:

    strong (fixed global batch):      speedup T(1) / T(N),  efficiency T(1) / (N * T(N))
    weak (fixed batch per process):   efficiency T(1) / T(N)

With repeats (the sweep's params.repeat), each repeat's efficiency uses that repeat's own runs;
the table shows the median over repeats and, in brackets, their range.

Prints a table, and writes SWEEP_DIR/scaling.json and SWEEP_DIR/scaling.png. Exits 1 with a
message (no traceback) when a configuration is missing, failed, or did not return a scaling
result; 2 when SWEEP_DIR is not a sweep directory.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
from pathlib import Path

from launcher import load_result
from launcher.errors import JaxlaunchError
from launcher.rundir import RunDirectory, atomic_write_bytes
from launcher.sweeps.directory import read_sweep
from launcher.sweeps.table import finite_for_json

MODES = ("strong", "weak")
REQUIRED = ("mode", "processes", "step_seconds", "examples_per_second", "cores_used_per_process")
PINNED_LIMIT = 1.1  # cores used per process above this: the process was not limited to one core
STARVED_BELOW = 0.9  # below this, other work shared the process's core


class ReportError(Exception):
    """A sweep that cannot give a scaling report; the message says which task and why."""


def load_configurations(sweep_dir) -> list[dict]:
    """Every task's result, with its task index; ReportError naming each task that has none."""
    sweep_dir = Path(sweep_dir)
    sweep = read_sweep(sweep_dir)  # UsageError if it is not a sweep directory
    results, problems = [], []
    for position, task in enumerate(sweep["tasks"]):
        index = task.get("index", position)
        run = RunDirectory(sweep_dir / str(task.get("folder") or f"task-{index:03d}"))
        values = task.get("values") or {}
        label = ", ".join(f"{k}={values[k]}" for k in [*sweep["keys"], *sorted(set(values) - set(sweep["keys"]))]
                          if k in values)  # in the sweep's key order
        status = run.read_status() if run.path.is_dir() else {}
        state = status.get("state") or ("MISSING" if not run.path.is_dir() else "PENDING")
        if state != "COMPLETED" or not run.result_file.exists():
            reason = status.get("reason") or ("no result.json" if state == "COMPLETED" else "")
            problems.append(f"task {index} ({label}): {state}" + (f": {reason}" if reason else "")
                            + (f"\n    output: {run.path / 'output.log'}" if run.path.is_dir() else ""))
            continue
        try:
            result = load_result(run)
        except Exception as exc:  # noqa: BLE001  (any unreadable result is reported, not raised)
            problems.append(f"task {index} ({label}): {run.result_file} cannot be read: {type(exc).__name__}: {exc}")
            continue
        missing = [k for k in REQUIRED if not isinstance(result, dict) or k not in result]
        if missing:
            problems.append(f"task {index} ({label}): its result lacks {', '.join(missing)}: "
                            f"not a jobs/benchmarks/scaling.py result")
            continue
        results.append({"task": index, **result})
    if problems:
        raise ReportError(f"{len(problems)} of {len(sweep['tasks'])} configurations in {sweep_dir} have no "
                          f"usable result:\n  " + "\n  ".join(problems)
                          + "\n  fix: rerun the sweep (jaxlaunch run jobs/benchmarks/scaling.yaml --run-dir NEW_DIR) "
                            "once the failed configurations' output.log shows why they failed.")
    if not results:
        raise ReportError(f"{sweep_dir}: the sweep has no configurations")
    return results


def scaling_report(configurations: list[dict]) -> dict:
    """Efficiencies of every N-process configuration against the 1-process one of its mode.

    With repeats (the sweep's params.repeat), each repeat's efficiency compares runs of that
    repeat, which ran close together in time; a row shows the median over repeats and their range."""
    by_key: dict[tuple, dict] = {}
    for config in configurations:
        key = (config["mode"], int(config["processes"]), config.get("repeat", 0))
        if key in by_key:
            raise ReportError(f"tasks {by_key[key]['task']} and {config['task']} both ran mode={key[0]} on "
                              f"{key[1]} processes (repeat {key[2]}); a scaling report needs one configuration "
                              f"of each (sweep nothing but processes_per_node, params.mode and params.repeat)")
        by_key[key] = config
    points: dict[str, list[dict]] = {}
    for mode in MODES:
        counts = sorted({n for m, n, _ in by_key if m == mode})
        if not counts:
            continue
        if counts[0] != 1 or len(counts) < 2:
            raise ReportError(f"mode {mode} ran on {counts} processes: it needs 1 process (the baseline) and "
                              f"at least one more count (the sweep of processes_per_node: [1, 2])")
        repeats = sorted({r for m, _, r in by_key if m == mode}, key=str)
        lacking = [f"{n} processes, repeat {r}" for n in counts for r in repeats if (mode, n, r) not in by_key]
        if lacking:
            raise ReportError(f"mode {mode} has no result for {', '.join(lacking)}: every repeat needs every "
                              f"process count")
        rows = []
        for n in counts:
            runs = [by_key[(mode, n, r)] for r in repeats]
            bases = [by_key[(mode, 1, r)]["step_seconds"] for r in repeats]
            times = [run["step_seconds"] for run in runs]
            efficiencies = [b / (n * t) if mode == "strong" else b / t for b, t in zip(bases, times)]
            speedups = [b / t if mode == "strong" else n * b / t for b, t in zip(bases, times)]
            used = [run["cores_used_per_process"] for run in runs]
            reduces = [run["allreduce_seconds"] for run in runs if run.get("allreduce_seconds") is not None]
            rows.append({
                "processes": n, "tasks": [run["task"] for run in runs], "repeats": len(runs),
                "per_process_batch": runs[0].get("per_process_batch"),
                "step_seconds": statistics.median(times), "step_seconds_per_repeat": times,
                "examples_per_second": statistics.median(run["examples_per_second"] for run in runs),
                "allreduce_seconds": statistics.median(reduces) if reduces else None,
                "speedup": statistics.median(speedups),
                "efficiency": statistics.median(efficiencies), "efficiency_per_repeat": efficiencies,
                "efficiency_range": [min(efficiencies), max(efficiencies)],
                # per process: the most it used in any repeat (the one-core check), and every repeat's
                "cores_used_per_process": [max(u[i] for u in used) for i in range(n)],
                "cores_used_per_repeat": used,
                "threads_pinned": min(run.get("threads_pinned", 0.0) for run in runs),
                "cores": runs[0].get("cores")})
        points[mode] = rows
    if not points:
        raise ReportError(f"no configuration has a mode in {MODES}")
    for mode, rows in points.items():
        for row in rows:
            if not (math.isfinite(row["efficiency"]) and row["efficiency"] > 0):
                raise ReportError(f"mode {mode}, {row['processes']} processes: efficiency {row['efficiency']} "
                                  f"is not a positive number (step_seconds {row['step_seconds']})")
    first = configurations[0]
    report = {
        "definitions": {"strong_efficiency": "T(1) / (N * T(N)), fixed global batch",
                        "weak_efficiency": "T(1) / T(N), fixed batch per process",
                        "T": "median step time over the timed steps (a step lasts as long as its slowest "
                             "process); with repeats, each repeat's efficiency uses that repeat's runs, and a "
                             "row shows the median over repeats and their range"},
        "cpu_count": first.get("cpu_count"), "layer_sizes": first.get("layer_sizes"),
        "parameters": first.get("parameters"), "steps": first.get("steps"),
        "repeats": max(row["repeats"] for rows in points.values() for row in rows),
        "modes": points,
        "configurations": [{k: v for k, v in c.items() if k != "step_seconds_all"} for c in configurations],
    }
    for mode, rows in points.items():
        report[f"{mode}_efficiency"] = rows[-1]["efficiency"]  # at the largest process count
    used = [u for rows in points.values() for row in rows for u in row["cores_used_per_process"]]
    report["max_cores_used_per_process"] = max(used)
    report["warnings"] = []
    if max(used) > PINNED_LIMIT:
        report["warnings"].append(f"a process used {max(used):.2f} cores: it was not limited to one core")
    starved = sorted({c["task"] for c in configurations if min(c["cores_used_per_process"]) < STARVED_BELOW
                      and c.get("threads_pinned") == 1.0})
    if starved:
        # A pinned rank computes or busy-polls in MPI all the time: less than its whole core means
        # something else ran on that core, and the step times are not this job's alone.
        report["warnings"].append(f"a process got less than {STARVED_BELOW} of its core in task(s) "
                                  + ", ".join(map(str, starved)) + ": other work ran on its core; rerun on an "
                                  "idle machine")
    unpinned = [c for c in configurations if c.get("threads_pinned") != 1.0]
    if unpinned:
        report["warnings"].append("not every thread was pinned to its core in task(s) "
                                  + ", ".join(str(c["task"]) for c in unpinned) + " (params.pin: false?)")
    most = max(n for rows in points.values() for n in (r["processes"] for r in rows))
    if report["cpu_count"] and most > report["cpu_count"]:
        report["warnings"].append(f"{most} processes on {report['cpu_count']} cores: cores were shared")
    return report


def _span(values, scale=1.0, digits=2) -> str:
    low, high = min(values) * scale, max(values) * scale
    return "" if len(values) < 2 else f" ({low:.{digits}f}-{high:.{digits}f})"


def format_report(report: dict) -> str:
    """A Markdown table; with repeats, step time and efficiency show the median and (min-max)."""
    header = ("| mode | processes | batch per process | step time | examples/s | allreduce alone | speedup "
              "| efficiency | cores used per process |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    for mode, rows in report["modes"].items():
        for row in rows:
            reduce = row["allreduce_seconds"]
            lines.append(
                f"| {mode} | {row['processes']} | {row['per_process_batch']} "
                f"| {1e3 * row['step_seconds']:.2f} ms{_span(row['step_seconds_per_repeat'], 1e3, 1)} "
                f"| {row['examples_per_second']:.0f} | {'' if reduce is None else f'{1e3 * reduce:.2f} ms'} "
                f"| {row['speedup']:.2f}x | {row['efficiency']:.2f}{_span(row['efficiency_per_repeat'])} "
                f"| {', '.join(f'{u:.2f}' for u in row['cores_used_per_process'])} |")
    summary = ", ".join(f"{mode} scaling efficiency {report[f'{mode}_efficiency']:.2f}" for mode in report["modes"])
    repeats = f"median of {report['repeats']} repeats, " if report["repeats"] > 1 else ""
    lines.append(f"{summary} ({repeats}{report['cpu_count']} cores; layers {report['layer_sizes']}, "
                 f"{report['parameters']} parameters)")
    lines += [f"warning: {w}" for w in report["warnings"]]
    return "\n".join(lines)


def plot_report(report: dict, path) -> Path:
    """Two panels: efficiency against processes (ideal 1.0 dashed), and examples per second."""
    from matplotlib.figure import Figure  # no pyplot: a bare Figure draws with Agg

    figure = Figure(figsize=(9, 4), layout="constrained")
    left, right = figure.subplots(1, 2)
    counts = sorted({row["processes"] for rows in report["modes"].values() for row in rows})
    left.plot(counts, [1.0] * len(counts), linestyle="--", color="gray", label="ideal")
    for mode, rows in report["modes"].items():
        n = [row["processes"] for row in rows]
        line, = left.plot(n, [row["efficiency"] for row in rows], marker="o", label=f"{mode} (median)")
        right.plot(n, [row["examples_per_second"] for row in rows], marker="o", label=f"{mode} (median)")
        if max(row["repeats"] for row in rows) > 1:  # every repeat, faint, to show the spread
            left.scatter([row["processes"] for row in rows for _ in row["efficiency_per_repeat"]],
                         [e for row in rows for e in row["efficiency_per_repeat"]], color=line.get_color(),
                         alpha=0.35, s=18)
    for axes in (left, right):
        axes.set_xticks(counts)
        axes.set_xlabel("processes (one core each)")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small")
    highest = max(row["efficiency"] for rows in report["modes"].values() for row in rows)
    left.set_ylim(0, max(1.15, 1.1 * highest))
    left.set_ylabel("efficiency")
    left.set_title("scaling efficiency of the training step")
    right.set_ylim(bottom=0)
    right.set_ylabel("examples per second")
    right.set_title("throughput")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    path = Path(path)
    atomic_write_bytes(path, buffer.getvalue())
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    sweep_dir = Path(argv[0])
    try:
        report = scaling_report(load_configurations(sweep_dir))
    except JaxlaunchError as exc:  # not a sweep directory, unreadable sweep.json
        print(f"scaling_report: {exc}", file=sys.stderr)
        return 2
    except ReportError as exc:
        print(f"scaling_report: {exc}", file=sys.stderr)
        return 1
    report["sweep_dir"] = str(sweep_dir.resolve())
    print(format_report(report))
    text = json.dumps(finite_for_json(report), indent=2, allow_nan=False)
    atomic_write_bytes(sweep_dir / "scaling.json", (text + "\n").encode())
    plot_report(report, sweep_dir / "scaling.png")
    print(f"wrote {sweep_dir / 'scaling.json'} and {sweep_dir / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
