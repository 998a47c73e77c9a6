"""Recovery that knows when to stop (issue 45), locally: an exception at the same step on every
attempt is the program's own and is not retried a third time; one that happens once is restarted."""

import json

import pytest

from conftest import TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.e2e
SPEC = TEST_JOBS / "fail_at_step.yaml"


def test_an_exception_at_the_same_step_on_every_attempt_ends_after_the_second(tmp_path):
    """Before: max_restarts: 3 meant four attempts failing the same way."""
    run_dir = tmp_path / "run"
    result = jaxlaunch("run", SPEC, "--run-dir", run_dir, "--set", "params.on=every", timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["attempts"] == 2 and status["state"] == "FAILED", status
    failure = json.loads((run_dir / "failure.json").read_text())
    assert failure["governor"]["decision"] == "stopped"
    why = failure["governor"]["why"]
    assert "the program's own exception, twice at the same place after step 5: ValueError at " in why, why
    assert "fail_at_step.py" in why and "in main" in why and "(attempts 0 and 1" in why
    assert why in status["reason"] and f"jaxlaunch: {why}" in result.stderr
    ends = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
            if '"attempt_end"' in line]
    assert [(e["attempt"], e["cause"], e["step"]) for e in ends] == [(0, "exception", 5), (1, "exception", 5)]


def test_an_exception_that_happens_once_is_restarted_and_the_job_completes(tmp_path):
    run_dir = tmp_path / "run"
    result = jaxlaunch("run", SPEC, "--run-dir", run_dir, "--set", "params.on=first", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["attempt"] == 1


def test_the_governor_off_retries_every_failure(tmp_path):
    run_dir = tmp_path / "run"
    result = jaxlaunch("run", SPEC, "--run-dir", run_dir, "--set", "params.on=every", "--set", "max_restarts=2",
                       "--set", "stop_repeated_failures=false", timeout=240)
    assert result.returncode == 1
    assert json.loads((run_dir / "status.json").read_text())["attempts"] == 3
