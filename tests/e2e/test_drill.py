"""`jaxlaunch drill` end to end (issue 34): the tutorial's training job survives a killed rank, a
preemption notice and a hung rank, each injected from outside at a point the seed chooses, with the
same result as its clean run; a careless copy that never checkpoints and ignores notices fails, and
the scorecard says which fault failed and why."""

import json

import pytest

from conftest import JOBS, TEST_JOBS, jaxlaunch

pytestmark = pytest.mark.e2e


def test_the_training_job_passes_the_drill_with_the_three_local_faults(tmp_path):
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", JOBS / "train_data_parallel.yaml", "--set", "params.steps=40",
                       "--set", "params.checkpoint_every=10", "--set", "params.step_seconds=0.05", "--seed", "1",
                       "--run-dir", folder, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert report["passed"] and report["seed"] == 1 and report["clean"]["checkpoint_interval"] == 10
    trials = {t["fault"]: t for t in report["trials"]}
    assert set(trials) == {"kill", "preempt", "hang"}
    assert trials["kill"]["faulted_state"] == "FAILED" and trials["hang"]["faulted_state"] == "TIMEOUT"
    assert trials["preempt"]["faulted_state"] == "PREEMPTED"
    for trial in trials.values():
        assert trial["detected"] and trial["final_state"] == "COMPLETED" and trial["same_result"], trial
        assert trial["detect_seconds"] is not None and trial["recover_seconds"] is not None, trial
        assert trial["steps_lost"] <= 10
    table = result.stderr[result.stderr.index("FAULT"):]
    assert table.count("\nPASS ") == 3 and "every fault passed" in result.stderr


def test_a_job_that_never_checkpoints_and_ignores_notices_fails_the_drill_and_says_why(tmp_path):
    folder = tmp_path / "drill"
    result = jaxlaunch("drill", TEST_JOBS / "careless_train.yaml", "--faults", "preempt,kill", "--seed", "3",
                       "--run-dir", folder, timeout=300)
    assert result.returncode == 1, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert not report["passed"] and report["clean"]["checkpoint_interval"] is None
    assert "preempt (preempt-1): the job did not checkpoint and stop on the preemption notice" in result.stderr
    assert "kill (kill-1): " in result.stderr and "the job never checkpoints" in result.stderr
    assert "drill: FAILED" in result.stderr


def test_an_unknown_fault_is_a_usage_error():
    result = jaxlaunch("drill", JOBS / "train_data_parallel.yaml", "--faults", "meteor")
    assert result.returncode == 2 and "meteor: choose from kill, preempt, hang" in result.stderr
