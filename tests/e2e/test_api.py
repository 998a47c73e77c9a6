"""The Python API (launcher.run / launcher.submit / launcher.job): handles on real local runs.
Slurm handles are exercised in test_slurm_explain.py's API test."""

import json
import os
import signal
import time

import pytest

import launcher
from conftest import EXAMPLES, TEST_JOBS


def test_run_returns_a_handle_that_waits_and_loads_the_result(tmp_path):
    job = launcher.run(EXAMPLES / "normalize.yaml", overrides=["nodes=1", "processes_per_node=1"],
                       run_dir=tmp_path / "run")
    assert job.run_dir == tmp_path / "run" and job.id == "run"
    assert job.wait(timeout=120) == "COMPLETED" and job.done()
    result = job.result()
    assert result["processes"] == 1 and abs(sum(result["values"]) - 1) < 1e-6
    assert job.failure() is None
    assert "COMPLETED" in job.logs() and "[rank 0]" in job.logs()
    assert "entrypoint finished" in job.logs(rank=0)
    again = launcher.job(tmp_path / "run")  # a handle on an earlier run
    assert again.state() == "COMPLETED" and again.result() == result


def test_a_failed_run_explains_itself_and_has_no_result(tmp_path):
    job = launcher.run(TEST_JOBS / "fail_on_rank.yaml", run_dir=tmp_path / "run")
    assert job.wait(timeout=120) == "FAILED"
    assert job.failure()["first_failure"]["rank"] == 1
    with pytest.raises(launcher.JobFailedError, match="has no result \\(state FAILED\\): rank 1 .* failed first") as error:
        job.result()
    assert error.value.state == "FAILED" and error.value.rank == 1
    assert "InjectedFailure: rank 1 failed on purpose" in error.value.remote_traceback


def test_cancel_stops_a_running_job(tmp_path):
    job = launcher.run(TEST_JOBS / "fail_on_rank.yaml", overrides=["entrypoint=fail_on_rank.py:sleep",
                                                                   "params.seconds=60"], run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    while "sleeping" not in job.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    job.cancel()
    assert job.state() == "CANCELLED" and job.done()


def sleeping_job(tmp_path, seconds=60):
    """A local job whose ranks sleep, and the moment they are asleep."""
    job = launcher.run(TEST_JOBS / "fail_on_rank.yaml", overrides=["entrypoint=fail_on_rank.py:sleep",
                                                                   f"params.seconds={seconds}"], run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    while "sleeping" not in job.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "sleeping" in job.logs(), job.logs()
    return job


def test_wait_with_a_timeout_on_a_running_job_raises_timeouterror(tmp_path):
    job = sleeping_job(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="still RUNNING after 0.05 s"):
            job.wait(timeout=0.05)
        assert time.monotonic() - started < 30  # it returned instead of waiting for the job
        assert not job.done() and job.state() == "RUNNING"
        with pytest.raises(TimeoutError, match="still RUNNING after 0.05 s"):
            launcher.job(job.run_dir).wait(timeout=0.05)  # a handle on a run found by its folder
    finally:
        job.cancel()
    assert job.state() == "CANCELLED"


def test_a_killed_supervisor_is_a_failed_job_not_running_forever(tmp_path):
    from launcher.supervisor.processes import job_processes

    job = sleeping_job(tmp_path)
    os.kill(job.process.pid, signal.SIGKILL)  # kill -9: no chance to write a final state
    assert job.wait(timeout=30) == "FAILED"
    assert job.done() and job.state() == "FAILED"
    status = json.loads((job.run_dir / "status.json").read_text())
    assert status["state"] == "FAILED" and status["exit_code"] == -signal.SIGKILL
    assert "supervisor process ended without a final state" in status["reason"]
    assert launcher.job(job.run_dir).state() == "FAILED"  # another handle (or `jaxlaunch status`) agrees
    assert job_processes(job.run_dir) == []  # its orphaned mpirun and ranks were ended


def test_result_of_a_job_that_failed_after_rank_0_wrote_its_result_raises(tmp_path):
    job = launcher.run(TEST_JOBS / "misbehave.yaml", overrides=["entrypoint=misbehave.py:fail_after_result"],
                       run_dir=tmp_path / "run")
    assert job.wait(timeout=120) == "FAILED"
    assert (job.run_dir / "result.json").exists()  # rank 0's value is there ...
    with pytest.raises(launcher.JobFailedError, match=r"has no result \(state FAILED\): rank 1 "):
        job.result()  # ... but the job did not complete
    with pytest.raises(launcher.JobFailedError, match=r"has no result \(state FAILED\)"):
        launcher.job(job.run_dir).result()
