"""ctx.report end to end with a running local job under mpirun: `jaxlaunch status -v` shows its step,
rate, ETA and each rank's step time, and `jaxlaunch watch` draws it in a terminal (tmux) and exits
with its code. The reporter, the supervisor's lines and their readers are in tests/unit/test_progress.py."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, jaxlaunch

JAXLAUNCH = str(Path(sys.executable).parent / "jaxlaunch")


def test_status_shows_step_rate_and_eta_of_a_running_local_job(tmp_path):
    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(EXAMPLES / "train_data_parallel.yaml"), "--run-dir", str(run_dir),
                                "--set", "params.steps=80", "--set", "params.step_seconds=0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        shown = ""
        while "steps/s" not in shown or "rank 1:" not in shown:  # rank 1 reports every 2 s
            assert process.poll() is None and time.monotonic() < deadline, shown
            time.sleep(0.5)
            shown = jaxlaunch("status", run_dir, "-v").stdout
        print(shown)  # the captured screen, in the test's output
        assert "RUNNING" in shown and "/80 (" in shown and "ETA" in shown and "loss=" in shown
        assert "rank 0:" in shown and "rank 1:" in shown and "ms/step" in shown
    finally:
        _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    from launcher import job

    handle = job(run_dir)
    assert handle.progress().step == 79 and handle.progress().total == 80
    reports = handle.metrics()
    assert [r["step"] for r in reports] == list(range(80)) and all("loss" in r for r in reports)
    ranks = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in ranks if r["kind"] == "rank"} == {0, 1}


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_draws_a_running_job_in_a_terminal_and_exits_with_its_code(tmp_path):
    run_dir = tmp_path / "run"
    session = f"jaxlaunch-watch-{tmp_path.name}"[:60]
    job = subprocess.Popen([JAXLAUNCH, "run", str(EXAMPLES / "train_data_parallel.yaml"), "--run-dir", str(run_dir),
                            "--set", "params.steps=80", "--set", "params.step_seconds=0.1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "status.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "110", "-y", "20",
                        f"{JAXLAUNCH} watch {run_dir} --interval 0.5; echo WATCH-EXIT=$?; sleep 60"], check=True)
        screens = []
        while True:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
            screens.append(screen)
            if "WATCH-EXIT=" in screen:
                break
            assert time.monotonic() < deadline, screen
            time.sleep(0.5)
        running = next((s for s in screens if "RUNNING" in s and "steps/s" in s), None)
        print(running)  # a captured screen, in the test's output
        print(screens[-1])
        assert running is not None, screens[-1]
        assert "/80" in running and "ETA" in running and "loss" in running and "step time per rank" in running
        assert "COMPLETED" in screens[-1] and "WATCH-EXIT=0" in screens[-1]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        job.wait(timeout=120)
