"""`jaxlaunch goodput` of real runs under mpirun: a training run that crashes once (rank 1 at step 25,
after the checkpoint of step 20: the restart computes steps 20-24 again), is then preempted (an agreed
stop: nothing lost) and resumed, is accounted for in the categories, and the work lost is the 5 steps
recomputed; a sweep's tasks are summed. Goodput and plot of written records are in
tests/unit/test_goodput.py."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, jaxlaunch
from launcher.cli import goodput_view as gp
from launcher.rundir import goodput as gp_record

JAXLAUNCH = str(Path(sys.executable).parent / "jaxlaunch")
TRAIN = EXAMPLES / "train_data_parallel.yaml"


def test_goodput_of_a_run_that_crashed_was_preempted_and_resumed(tmp_path):
    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(TRAIN), "--run-dir", str(run_dir), "--set", "params.steps=60",
                                "--set", "params.step_seconds=0.1", "--set", "params.checkpoint_every=20",
                                "--set", "max_restarts=1", "--set", "params.fail_rank=1",
                                "--set", "params.fail_step=25", "--set", "params.fail_delay=1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not any(e.get("event") == "restored" for e in _events(run_dir)):
        assert process.poll() is None and time.monotonic() < deadline, "the restart did not come"
        time.sleep(0.2)
    while not (run_dir / "checkpoints" / "step-00000040").exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint 40"
        time.sleep(0.1)
    process.send_signal(signal.SIGUSR2)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 75, err
    resumed = jaxlaunch("run", "--resume", run_dir, timeout=240)
    assert resumed.returncode == 0, resumed.stderr

    result = gp_record.goodput(run_dir)
    assert result.accounted >= 0.95, result.seconds
    assert result.steps_recomputed == 5  # steps 20-24: done before the crash, again after the restart
    assert 0.4 < result.seconds["work lost"] < 1.5  # 5 steps of ~0.11 s (their span in the first attempt)
    assert len(result.attempts) == 3
    for category in ("start-up", "first step", "productive steps", "wind-down", "between attempts"):
        assert result.seconds[category] > 0, category
    assert result.seconds["productive steps"] > 0.5 * 60 * 0.1

    shown = jaxlaunch("goodput", run_dir, "--plot", tmp_path / "goodput.png")
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    assert "work lost (5 steps recomputed)" in shown.stdout and "% accounted" in shown.stdout
    assert (tmp_path / "goodput.png").stat().st_size > 10_000
    from launcher import job

    assert job(run_dir).goodput().steps_recomputed == 5


def _events(run_dir):
    try:
        return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    except OSError:
        return []


def test_a_sweep_gets_its_tasks_goodput_summed_and_a_curve_per_configuration(tmp_path):
    pytest.importorskip("matplotlib")
    sweep_dir = tmp_path / "sweep"
    spec = tmp_path / "sweep.yaml"
    spec.write_text((EXAMPLES / "sweep_train.yaml").read_text().replace("[0.01, 0.03, 0.1]", "[0.03, 0.1]")
                    .replace("params.seed: [0, 1]", "params.seed: [0]")
                    .replace("entrypoint: train_data_parallel.py:main",
                             f"entrypoint: {EXAMPLES / 'train_data_parallel.py'}:main"))
    ran = jaxlaunch("run", spec, "--run-dir", sweep_dir, "--set", "params.steps=10", timeout=300)
    assert ran.returncode == 0, ran.stderr
    tasks = sorted(p for p in sweep_dir.iterdir() if (p / "status.json").exists())
    assert len(tasks) == 2
    parts = [gp_record.goodput(task) for task in tasks]
    total = gp.sweep_goodput(sweep_dir)
    assert total.wall_seconds == pytest.approx(sum(p.wall_seconds for p in parts))
    assert total.seconds["productive steps"] == pytest.approx(sum(p.seconds["productive steps"] for p in parts))
    shown = jaxlaunch("goodput", sweep_dir, "--plot", tmp_path / "sweep.png")
    assert shown.returncode == 0 and "% accounted" in shown.stdout, shown.stderr
    curves = jaxlaunch("results", sweep_dir, "--curve", "loss")
    assert curves.returncode == 0, curves.stderr
    png = sweep_dir / "loss_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
