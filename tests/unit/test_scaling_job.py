"""The scaling job's report (jobs/benchmarks/scaling_report.py): its arithmetic and its failure messages,
checked on fake sweep directories, which run no job. The sweep itself, under mpirun, then the report,
is tests/e2e/test_scaling_job_sweep.py."""

import json
import subprocess
import sys

import pytest

from conftest import BENCHMARKS
from launcher.rundir.results import write_result
from launcher.rundir import RunDirectory, atomic_write_json

REPORT = BENCHMARKS / "scaling_report.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report(sweep_dir):
    return subprocess.run([sys.executable, str(REPORT), str(sweep_dir)], capture_output=True, text=True,
                          timeout=120)


def fake_sweep(root, tasks):
    """A sweep directory as jaxlaunch writes it; tasks: (values, status, result or None)."""
    root.mkdir()
    entries = []
    for index, (values, status, result) in enumerate(tasks):
        folder = f"task-{index:03d}"
        entries.append({"index": index, "folder": folder, "values": values})
        run = RunDirectory(root / folder)
        run.path.mkdir()
        atomic_write_json(run.status_file, status)
        if result is not None:
            write_result(run, result)
    atomic_write_json(root / "sweep.json", {"version": 1, "name": "scaling", "keys": list(tasks[0][0]),
                                            "tasks": entries})
    return root


def fake_result(mode, processes, step_seconds, repeat=0):
    return {"mode": mode, "processes": processes, "repeat": repeat, "cpu_count": 2, "per_process_batch": 8,
            "step_seconds": step_seconds, "examples_per_second": 8 * processes / step_seconds,
            "allreduce_seconds": 0.001, "cores_used_per_process": [0.98] * processes, "threads_pinned": 1.0,
            "cores": list(range(processes)), "layer_sizes": [4, 8, 2], "parameters": 58}


def values(processes, mode):
    return {"processes_per_node": processes, "params.mode": mode}


COMPLETED = {"state": "COMPLETED"}


def test_report_efficiencies_from_step_times(tmp_path):
    sweep_dir = fake_sweep(tmp_path / "sweep", [
        (values(1, "strong"), COMPLETED, fake_result("strong", 1, 0.100)),
        (values(1, "weak"), COMPLETED, fake_result("weak", 1, 0.100)),
        (values(2, "strong"), COMPLETED, fake_result("strong", 2, 0.0625)),
        (values(2, "weak"), COMPLETED, fake_result("weak", 2, 0.125)),
    ])
    made = report(sweep_dir)
    assert made.returncode == 0, made.stderr
    document = json.loads((sweep_dir / "scaling.json").read_text())
    assert document["strong_efficiency"] == pytest.approx(0.100 / (2 * 0.0625))  # 0.8
    assert document["weak_efficiency"] == pytest.approx(0.100 / 0.125)           # 0.8
    assert document["modes"]["strong"][1]["speedup"] == pytest.approx(1.6)
    assert "| strong | 2 | 8 | 62.50 ms |" in made.stdout
    assert (sweep_dir / "scaling.png").read_bytes()[:8] == PNG_MAGIC


def test_report_takes_each_repeats_efficiency_then_the_median(tmp_path):
    tasks = []
    for repeat, (strong_2, weak_2) in enumerate([(0.0625, 0.125), (0.05, 0.1), (0.1, 0.2)]):
        for processes, mode, t in [(1, "strong", 0.1), (1, "weak", 0.1), (2, "strong", strong_2), (2, "weak", weak_2)]:
            t = t * (1 + repeat) if processes == 1 else t  # repeat 2's baseline is slower too
            tasks.append(({"params.repeat": repeat, **values(processes, mode)}, COMPLETED,
                          fake_result(mode, processes, t, repeat)))
    sweep_dir = fake_sweep(tmp_path / "sweep", tasks)
    made = report(sweep_dir)
    assert made.returncode == 0, made.stderr
    document = json.loads((sweep_dir / "scaling.json").read_text())
    strong = document["modes"]["strong"][1]
    # per repeat: 0.1 / (2 * 0.0625), 0.2 / (2 * 0.05), 0.3 / (2 * 0.1)
    assert strong["efficiency_per_repeat"] == pytest.approx([0.8, 2.0, 1.5])
    assert document["strong_efficiency"] == pytest.approx(1.5) and strong["efficiency_range"] == [0.8, 2.0]
    assert document["modes"]["weak"][1]["efficiency_per_repeat"] == pytest.approx([0.8, 2.0, 1.5])
    assert document["repeats"] == 3
    assert "| strong | 2 | 8 | 62.50 ms (50.0-100.0) |" in made.stdout and "| 1.50 (0.80-2.00) |" in made.stdout


def test_report_names_failed_and_missing_tasks_without_a_traceback(tmp_path):
    sweep_dir = fake_sweep(tmp_path / "sweep", [
        (values(1, "strong"), COMPLETED, fake_result("strong", 1, 0.1)),
        (values(1, "weak"), {"state": "FAILED", "reason": "rank 0 failed first: RuntimeError: boom"}, None),
        (values(2, "strong"), {"state": "RUNNING"}, None),
        (values(2, "weak"), COMPLETED, fake_result("weak", 2, 0.1)),
    ])
    made = report(sweep_dir)
    assert made.returncode == 1
    assert "Traceback" not in made.stderr
    assert "2 of 4 configurations" in made.stderr
    assert "task 1 (processes_per_node=1, params.mode=weak): FAILED: rank 0 failed first: RuntimeError: boom" \
        in made.stderr
    assert "task 2 (processes_per_node=2, params.mode=strong): RUNNING" in made.stderr
    assert not (sweep_dir / "scaling.json").exists()


def test_report_needs_the_one_process_baseline(tmp_path):
    sweep_dir = fake_sweep(tmp_path / "sweep", [
        (values(2, "strong"), COMPLETED, fake_result("strong", 2, 0.1)),
        (values(2, "weak"), COMPLETED, fake_result("weak", 2, 0.1)),
    ])
    made = report(sweep_dir)
    assert made.returncode == 1 and "Traceback" not in made.stderr
    assert "mode strong ran on [2] processes: it needs 1 process (the baseline)" in made.stderr


def test_report_refuses_a_folder_that_is_not_a_sweep(tmp_path):
    made = report(tmp_path)
    assert made.returncode == 2 and "Traceback" not in made.stderr
    assert "is not a sweep directory" in made.stderr
