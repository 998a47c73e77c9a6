"""The backend seam on real local runs (`jaxlaunch run` under mpirun): a run found by its folder
can be waited on, cancelled and read, and one whose supervisor was killed is FAILED. The seam without
a real job is in tests/unit/test_backends.py."""

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import launcher
from conftest import TEST_JOBS, jaxlaunch
from launcher.backends import find_job
from launcher.cli import main
from launcher.states import JobState


def start_jaxlaunch_run(run_dir, seconds=60):
    exe = os.path.join(os.path.dirname(sys.executable), "jaxlaunch")
    process = subprocess.Popen([exe, "run", str(TEST_JOBS / "fail_on_rank.yaml"), "--run-dir", str(run_dir), "--set",
                                "entrypoint=fail_on_rank.py:sleep", "--set", f"params.seconds={seconds}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "sleeping" not in (run_dir / "logs" / "rank-0.log").read_text() \
            if (run_dir / "logs" / "rank-0.log").exists() else time.monotonic() < deadline:
        time.sleep(0.2)
    return process


def test_logs_of_a_jaxlaunch_run_run_are_its_ranks_lines(tmp_path):
    result = jaxlaunch("run", TEST_JOBS / "fail_on_rank.yaml", "--run-dir", tmp_path / "run", "--set",
                       "entrypoint=fail_on_rank.py:sleep", "--set", "params.seconds=0", timeout=120)
    assert result.returncode == 0, result.stderr
    logs = launcher.job(tmp_path / "run").logs()
    assert "[rank 0] " in logs and "[rank 1] " in logs and "sleeping 0 s" in logs
    assert launcher.job(tmp_path / "run").logs(rank=1) == (tmp_path / "run" / "logs" / "rank-1.log").read_text()


def test_a_run_found_by_its_folder_can_be_waited_on_and_cancelled(tmp_path):
    process = start_jaxlaunch_run(tmp_path / "run")
    try:
        job = find_job(tmp_path / "run")
        assert job.state() == JobState.RUNNING and not job.done()
        with pytest.raises(TimeoutError):
            job.wait(timeout=0.5)
        result = CliRunner().invoke(main, ["cancel", str(tmp_path / "run")])
        assert result.exit_code == 0, result.output
        assert job.state() == JobState.CANCELLED and job.exit_code() == 143
        assert process.wait(timeout=60) == 143  # `jaxlaunch run` itself ended as if Ctrl-C'd... by SIGTERM
        with pytest.raises(launcher.errors.JobStateError, match="already ended"):
            job.cancel()
    finally:
        process.kill()
        process.wait()


def test_a_found_run_whose_supervisor_was_killed_is_failed(tmp_path):
    process = start_jaxlaunch_run(tmp_path / "run")
    try:
        job = find_job(tmp_path / "run")
        assert job.state() == JobState.RUNNING
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert job.wait(timeout=30) == JobState.FAILED
        assert "supervisor process ended without a final state" in job.status().reason
    finally:
        process.kill()
        process.wait()
