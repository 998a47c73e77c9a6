"""The sweep results table (launcher/sweeps/table.py) over fake sweep directories: no jobs run."""

import csv
import json
import math
import sys

import numpy as np
import pytest

from launcher.errors import UsageError
from launcher.rundir.results import write_result
from launcher.rundir import RunDirectory, atomic_write_json
from launcher.sweeps.directory import read_sweep
from launcher.sweeps.metrics import best, plot
from launcher.sweeps.table import collect, format_table, write_csv, write_json

LR, SEED, OPT = "params.learning_rate", "params.seed", "params.optimizer"
NO_RESULT = object()


def make_sweep(root, keys, tasks, name="train-sweep"):
    """A sweep directory: tasks are dicts with values, and optionally state, started, ended,
    result (written with write_result), result_text (written as is) and no_folder."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    for index, task in enumerate(tasks):
        folder = f"task-{index:03d}"
        entries.append({"index": index, "folder": folder, "values": task["values"]})
        if task.get("no_folder"):
            continue
        run = RunDirectory(root / folder)
        run.path.mkdir()
        status = {k: task[k] for k in ("state", "started", "ended") if k in task}
        if status:
            atomic_write_json(run.status_file, status)
        if task.get("result", NO_RESULT) is not NO_RESULT:
            write_result(run, task["result"])
        if "result_text" in task:
            run.result_file.write_text(task["result_text"])
    (root / "sweep.json").write_text(json.dumps({
        "version": 1, "name": name, "spec": "/abs/jobs/sweep.yaml", "keys": keys, "backend": "local",
        "created": 1763900000.0, "tasks": entries}))
    return root


def done(values, result, seconds=10.0):
    return {"values": values, "state": "COMPLETED", "started": 1000.0, "ended": 1000.0 + seconds, "result": result}


def grid_sweep(tmp_path, three_keys=False):
    """lr x seed (x optimizer): loss = lr * 10 + seed (+ 100 for sgd), so the best is easy to tell."""
    tasks = []
    for opt in (["adam", "sgd"] if three_keys else [None]):
        for seed in (0, 1):
            for lr in (0.1, 0.001, 0.01):  # not sorted: the plot must sort by x
                values = {LR: lr, SEED: seed, **({OPT: opt} if opt else {})}
                loss = lr * 10 + seed + (100 if opt == "sgd" else 0)
                tasks.append(done(values, {"loss": loss, "accuracy": 1 - loss / 200}))
    keys = [LR, SEED] + ([OPT] if three_keys else [])
    return collect(make_sweep(tmp_path / "sweep", keys, tasks))


def test_columns_in_order_with_only_scalar_results(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [LR, SEED], [
        done({LR: 0.05, SEED: 0}, {
            "loss": 0.25, "weights": np.arange(3.0), "history": [1.0, 0.5], "config": {"depth": 2},
            "accuracy": np.float32(0.75), "steps": np.int64(100), "zero_d": np.array(2.5),
            "converged": True, "optimizer": "adam", "log_path": "x" * 41, "nothing": None}, seconds=12.34),
        done({LR: 0.05, SEED: 1}, {"loss": 0.5, "tokens": 7}),
    ])
    table = collect(sweep)
    assert table.columns == ["task", LR, SEED, "state", "seconds", "loss", "accuracy", "steps", "zero_d",
                             "converged", "optimizer", "tokens"]
    first, second = table.rows
    assert first == {"task": 0, LR: 0.05, SEED: 0, "state": "COMPLETED", "seconds": 12.3, "loss": 0.25,
                     "accuracy": 0.75, "steps": 100, "zero_d": 2.5, "converged": True, "optimizer": "adam",
                     "tokens": None}
    # numpy scalars come out as Python numbers: csv, json and tabulate all handle those
    assert type(first["accuracy"]) is float and type(first["steps"]) is int and type(first["zero_d"]) is float
    assert second["tokens"] == 7 and second["optimizer"] is None
    assert table.keys == [LR, SEED] and table.name == "train-sweep" and table.warnings == []


def test_scalar_result_and_result_keys_that_clash_with_columns(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [LR], [
        done({LR: 0.1}, 3.5),
        done({LR: 0.2}, {"state": "converged", LR: 9.0, "loss": 1.0}),
        done({LR: 0.3}, np.arange(4)),  # an array result: no column at all
    ])
    table = collect(sweep)
    assert table.columns == ["task", LR, "state", "seconds", "result", "result.state", f"result.{LR}", "loss"]
    assert [row["result"] for row in table.rows] == [3.5, None, None]
    assert table.rows[1]["state"] == "COMPLETED" and table.rows[1]["result.state"] == "converged"
    assert table.rows[1][LR] == 0.2 and table.rows[1][f"result.{LR}"] == 9.0
    assert table.rows[2]["state"] == "COMPLETED" and table.rows[2]["loss"] is None


def test_running_and_pending_tasks_show_their_state_and_blanks(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        done({SEED: 0}, {"loss": 0.123456789}),
        {"values": {SEED: 1}, "state": "RUNNING", "started": 1000.0},
        {"values": {SEED: 2}},                       # folder made, no status.json yet
        {"values": {SEED: 3}, "no_folder": True},    # not even a folder
    ])
    table = collect(sweep)
    assert [row["state"] for row in table.rows] == ["COMPLETED", "RUNNING", "PENDING", "PENDING"]
    assert table.rows[1]["seconds"] is None and table.rows[1]["loss"] is None
    lines = format_table(table).splitlines()
    assert lines[0].split() == ["task", SEED, "state", "seconds", "loss"]
    assert lines[2].split() == ["0", "0", "COMPLETED", "10", "0.123457"]  # 6 significant digits
    assert lines[3].split() == ["1", "1", "RUNNING"]                       # blanks, not None or nan
    assert lines[5].split() == ["3", "3", "PENDING"]


def test_format_table_keeps_strings_that_look_like_numbers(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [done({SEED: 0}, {"tag": "1e5", "loss": float("nan")})])
    lines = format_table(collect(sweep)).splitlines()
    assert lines[2].split() == ["0", "0", "COMPLETED", "10", "1e5", "nan"]


def test_one_unreadable_task_does_not_break_the_table(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        done({SEED: 0}, {"loss": 1.0}),
        {"values": {SEED: 1}, "state": "COMPLETED", "result_text": "{not json"},
        done({SEED: 2}, {"loss": 3.0}),
    ])
    (sweep / "task-002" / "status.json").write_text("{half a")
    table = collect(sweep)
    assert [row["state"] for row in table.rows] == ["COMPLETED", "COMPLETED", "UNKNOWN"]
    assert [row["loss"] for row in table.rows] == [1.0, None, 3.0]
    assert len(table.warnings) == 2
    assert table.warnings[0].startswith("task 1: ") and "result.json" in table.warnings[0]
    assert table.warnings[1].startswith("task 2: ") and "status.json" in table.warnings[1]


def test_not_a_sweep_directory(tmp_path):
    with pytest.raises(UsageError) as error:
        collect(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{tmp_path} is not a sweep directory (no sweep.json).\n  fix: ")
    (tmp_path / "sweep.json").write_text("[1, 2")
    with pytest.raises(UsageError, match=r"sweep.json cannot be read: .*\n  fix: "):
        read_sweep(tmp_path)
    (tmp_path / "sweep.json").write_text('{"keys": ["a"]}')
    with pytest.raises(UsageError, match=r"sweep.json has no list of tasks.\n  fix: "):
        read_sweep(tmp_path)


def test_csv_round_trip(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [LR, SEED], [
        done({LR: 1e-3, SEED: 0}, {"loss": 0.1 + 0.2, "ok": True, "name": "a,b \"quoted\""}),
        {"values": {LR: 1e-2, SEED: 1}, "state": "RUNNING"},
    ])
    table = collect(sweep)
    path = write_csv(table, tmp_path / "results.csv")
    with open(path, newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == table.columns
    assert rows[1] == ["0", "0.001", "0", "COMPLETED", "10.0", repr(0.1 + 0.2), "True", "a,b \"quoted\""]
    assert float(rows[1][5]) == 0.1 + 0.2  # full precision, not the table's 6 digits
    assert rows[2] == ["1", "0.01", "1", "RUNNING", "", "", "", ""]
    assert len(rows) == 3
    assert not list(tmp_path.glob(".results.csv.*"))  # no temp file left behind


def test_json_round_trip_writes_non_finite_floats_as_null(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        done({SEED: 0}, {"loss": 0.5, "grad_norm": float("inf")}),
        done({SEED: 1}, {"loss": float("nan"), "grad_norm": 2.0}),
        {"values": {SEED: 2}, "state": "FAILED"},
    ])
    table = collect(sweep)
    text = write_json(table, tmp_path / "results.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    document = json.loads(text)
    assert document["columns"] == ["task", SEED, "state", "seconds", "loss", "grad_norm"]
    assert document["rows"] == [
        {"task": 0, SEED: 0, "state": "COMPLETED", "seconds": 10.0, "loss": 0.5, "grad_norm": None},
        {"task": 1, SEED: 1, "state": "COMPLETED", "seconds": 10.0, "loss": None, "grad_norm": 2.0},
        {"task": 2, SEED: 2, "state": "FAILED", "seconds": None, "loss": None, "grad_norm": None},
    ]
    assert math.isinf(table.rows[0]["grad_norm"])  # the table itself keeps the value


def test_best_minimum_and_maximum_skip_missing_and_nan(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        done({SEED: 0}, {"loss": 0.5, "accuracy": 0.7}),
        done({SEED: 1}, {"loss": float("nan"), "accuracy": 0.99}),
        {"values": {SEED: 2}, "state": "RUNNING"},
        done({SEED: 3}, {"loss": 0.2, "accuracy": 0.8}),
        done({SEED: 4}, {"loss": 0.9, "accuracy": float("inf")}),
    ])
    table = collect(sweep)
    assert best(table, "loss")["task"] == 3
    assert best(table, "loss", minimize=False)["task"] == 4
    assert best(table, "accuracy", minimize=False)["task"] == 1  # inf is not a usable maximum
    assert best(table, "accuracy")["task"] == 0


def test_best_unknown_metric_lists_numeric_columns(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        done({SEED: 0}, {"loss": 0.5, "name": "a", "ok": True}),
        {"values": {SEED: 1}, "state": "RUNNING"},
    ])
    table = collect(sweep)
    with pytest.raises(UsageError) as error:
        best(table, "los")
    assert str(error.value) == ("no column 'los' in the sweep results.\n"
                                f"  fix: pick one of the numeric columns: {SEED}, seconds, loss.")
    with pytest.raises(UsageError, match=r"no task has a finite number in column 'name' yet"):
        best(table, "name")


def capture_figures(monkeypatch):
    """Keep each figure plot() saves, to look at its lines after the PNG is written."""
    Figure = pytest.importorskip("matplotlib.figure").Figure  # matplotlib is optional (the bench extra)
    figures, original = [], Figure.savefig

    def savefig(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # axes, lines and text, not an empty canvas


def test_plot_defaults_to_first_key_on_x_and_second_as_lines(tmp_path, monkeypatch):
    table = grid_sweep(tmp_path)
    figures = capture_figures(monkeypatch)
    out = tmp_path / "loss.png"
    assert plot(table, "loss", out) == out
    assert_png(out)
    (axes,) = figures[0].axes
    assert axes.get_xlabel() == LR and axes.get_ylabel() == "loss"
    assert axes.get_title() == f"train-sweep: loss against {LR}"
    assert axes.get_xscale() == "log"  # 0.001 .. 0.1 spans a factor of 100
    assert [line.get_label() for line in axes.get_lines()] == [f"{SEED}=0", f"{SEED}=1"]
    seed1 = axes.get_lines()[1]
    assert list(seed1.get_xdata()) == [0.001, 0.01, 0.1]  # sorted by x
    assert list(seed1.get_ydata()) == pytest.approx([1.01, 1.1, 2.0])
    assert [t.get_text() for t in axes.get_legend().get_texts()] == [f"{SEED}=0", f"{SEED}=1"]


def test_plot_with_three_keys_draws_one_line_per_combination(tmp_path, monkeypatch):
    table = grid_sweep(tmp_path, three_keys=True)
    figures = capture_figures(monkeypatch)
    out = plot(table, "accuracy", tmp_path / "acc.png", x=SEED, by=OPT)
    assert_png(out)
    (axes,) = figures[0].axes
    assert axes.get_xscale() == "linear"  # seeds 0 and 1 include 0
    labels = [line.get_label() for line in axes.get_lines()]
    # by first, then the keys left over; sorted by value, not in the order the tasks ran
    assert labels == [f"{OPT}=adam, {LR}=0.001", f"{OPT}=adam, {LR}=0.01", f"{OPT}=adam, {LR}=0.1",
                      f"{OPT}=sgd, {LR}=0.001", f"{OPT}=sgd, {LR}=0.01", f"{OPT}=sgd, {LR}=0.1"]
    assert all(list(line.get_xdata()) == [0.0, 1.0] for line in axes.get_lines())


def test_plot_with_string_x_values_uses_sorted_ticks(tmp_path, monkeypatch):
    table = grid_sweep(tmp_path, three_keys=True)
    figures = capture_figures(monkeypatch)
    plot(table, "loss", tmp_path / "opt.png", x=OPT, by=SEED)
    (axes,) = figures[0].axes
    assert [t.get_text() for t in axes.get_xticklabels()] == ["adam", "sgd"]
    assert len(axes.get_lines()) == 6  # seed x learning rate


def test_plot_skips_rows_without_the_metric(tmp_path, monkeypatch):
    sweep = make_sweep(tmp_path / "sweep", [LR], [
        done({LR: 0.1}, {"loss": 1.0}),
        {"values": {LR: 0.2}, "state": "RUNNING"},
        done({LR: 0.3}, {"loss": float("nan")}),
        done({LR: 0.4}, {"loss": 4.0}),
    ])
    figures = capture_figures(monkeypatch)
    plot(collect(sweep), "loss", tmp_path / "loss.png")
    (line,) = figures[0].axes[0].get_lines()
    assert list(line.get_xdata()) == [0.1, 0.4] and line.get_label() == "loss"
    assert figures[0].axes[0].get_xscale() == "linear"  # a factor of 4 only


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    table = grid_sweep(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    with pytest.raises(UsageError, match=r"^plotting needs matplotlib, which is not installed.\n  fix: pip "):
        plot(table, "loss", tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def test_plot_errors_name_the_valid_choices(tmp_path):
    table = grid_sweep(tmp_path, three_keys=True)
    out = tmp_path / "bad.png"
    with pytest.raises(UsageError) as error:
        plot(table, "loss", out, x="loss")
    assert str(error.value) == ("x 'loss' is not a swept key.\n"
                                f"  fix: pick one of the swept keys: {LR}, {SEED}, {OPT}.")
    with pytest.raises(UsageError, match=r"by 'params.depth' is not a swept key.\n  fix: .*params.seed"):
        plot(table, "loss", out, by="params.depth")
    with pytest.raises(UsageError) as error:
        plot(table, "loss", out, x=SEED, by=SEED)
    assert str(error.value) == f"by '{SEED}' is also x.\n  fix: pick another swept key for by: {LR}, {OPT}."
    with pytest.raises(UsageError, match=r"no column 'val_loss' .*\n  fix: .*seconds, loss, accuracy"):
        plot(table, "val_loss", out)
    assert not out.exists()


def test_plot_before_any_task_has_the_metric(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", [SEED], [
        {"values": {SEED: 0}, "state": "RUNNING"},
        done({SEED: 1}, {"loss": float("nan")}),
    ])
    table = collect(sweep)
    with pytest.raises(UsageError) as error:
        plot(table, "loss", tmp_path / "loss.png")
    assert str(error.value).startswith("no task has a finite number in column 'loss' yet "
                                       "(task states: COMPLETED, RUNNING).\n  fix: wait for tasks to complete")
    assert not (tmp_path / "loss.png").exists()
