"""The Python API (launcher.run / launcher.submit / launcher.job): handles on real local runs.
Slurm handles are exercised in test_slurm_explain.py's API test."""

import time

import pytest

import launcher
from conftest import JOBS, TEST_JOBS
from launcher.errors import UsageError


def test_run_returns_a_handle_that_waits_and_loads_the_result(tmp_path):
    job = launcher.run(JOBS / "normalize.yaml", overrides=["nodes=1", "processes_per_node=1"], run_dir=tmp_path / "run")
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
    with pytest.raises(UsageError, match="has no result \\(state FAILED\\): rank 1 .* failed first"):
        job.result()


def test_cancel_stops_a_running_job(tmp_path):
    job = launcher.run(TEST_JOBS / "fail_on_rank.yaml", overrides=["entrypoint=fail_on_rank.py:sleep",
                                                                   "params.seconds=60"], run_dir=tmp_path / "run")
    deadline = time.monotonic() + 60
    while "sleeping" not in job.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    job.cancel()
    assert job.state() == "CANCELLED" and job.done()


def test_a_jobspec_takes_no_overrides(tmp_path):
    spec = launcher.load_spec(JOBS / "normalize.yaml")
    with pytest.raises(UsageError, match="overrides apply to a spec file"):
        launcher.run(spec, overrides=["nodes=2"], run_dir=tmp_path / "run")
