"""Preemption on this machine: SIGUSR2 to `jaxlaunch run` -> the ranks agree on a step,
checkpoint and stop (exit 75) -> `jaxlaunch run --resume RUN_DIR` finishes with the same bits."""

import json
import os
import signal

from conftest import EXAMPLES, jaxlaunch
from supervision_helpers import control_records, rank_pid, wait_for_file
from preemption_helpers import (TRAIN, TRAIN_SETTINGS, assert_same_training, events, load_result, start,
                                wait_for_checkpoint)


def test_sigusr2_checkpoints_and_resume_is_bit_identical(reference, tmp_path):
    run_dir = tmp_path / "run"
    process = start("run", TRAIN, *TRAIN_SETTINGS, "--run-dir", run_dir)
    wait_for_checkpoint(run_dir, 20, process=process)
    process.send_signal(signal.SIGUSR2)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    assert "PREEMPTED" in err and f"jaxlaunch run --resume {run_dir}" in err
    assert out == ""  # no result: the work is not finished
    assert not (run_dir / "result.json").exists()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "PREEMPTED" and status["exit_code"] == 75
    stopped_at = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))
    assert 20 < stopped_at < 80  # a checkpoint at the agreed step, not only the periodic one
    dones = control_records(run_dir, "done")
    assert dones[0]["stopped"]["call"] == dones[1]["stopped"]["call"]  # the same step on both ranks
    assert "supervisor" in dones[0]["stopped"]["sources"]

    resumed = jaxlaunch("run", "--resume", run_dir, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    result = load_result(run_dir)
    assert_same_training(result, reference)
    assert result["attempt"] == 1
    # the losses restored from the checkpoint read as plain numbers, like those computed after it
    raw = json.loads((run_dir / "result.json").read_text())["losses"]
    assert all(type(loss) is float for loss in raw), [loss for loss in raw if type(loss) is not float][:2]
    assert (run_dir / "logs" / "attempt-0" / "rank-0.log").exists()  # the first attempt's logs kept
    timeline = [e["event"] for e in events(run_dir)]
    for event in ("notice", "checkpoint", "stopped", "resumed", "restored"):
        assert event in timeline, timeline
    assert timeline.index("notice") < timeline.index("stopped") < timeline.index("resumed")
    restored = next(e for e in events(run_dir) if e["event"] == "restored")
    assert restored["step"] == stopped_at


def test_resume_refuses_what_it_cannot_continue(tmp_path):
    done = tmp_path / "done"
    assert jaxlaunch("run", EXAMPLES / "normalize.yaml", "--run-dir", done, timeout=120).returncode == 0
    result = jaxlaunch("run", "--resume", done)
    assert result.returncode == 2
    assert f"--resume {done}: that run COMPLETED; there is nothing to continue" in result.stderr
    assert "Traceback" not in result.stderr

    result = jaxlaunch("run", "--resume", tmp_path / "nowhere")
    assert result.returncode == 2 and "not a run directory (no spec.json there)" in result.stderr

    result = jaxlaunch("run", TRAIN, "--resume", done)
    assert result.returncode == 2 and "--resume RUN_DIR runs the spec saved in RUN_DIR" in result.stderr

    result = jaxlaunch("run")
    assert result.returncode == 2 and "missing SPEC (or --resume RUN_DIR)" in result.stderr


def test_usr2_to_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    """As `scancel --signal=USR2` does: the signal reaches a rank, not the supervisor. The
    agreement still stops both ranks at the same step."""
    run_dir = tmp_path / "run"
    process = start("run", TRAIN, *TRAIN_SETTINGS, "--run-dir", run_dir)
    wait_for_checkpoint(run_dir, 20, process=process)
    os.kill(rank_pid(run_dir, 1), signal.SIGUSR2)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 75, err
    dones = control_records(run_dir, "done")
    assert dones[0]["stopped"]["call"] == dones[1]["stopped"]["call"]
    assert dones[0]["stopped"]["sources"] == ["SIGUSR2"]
    notices = control_records(run_dir, "notice")
    assert notices[1]["sources"] == ["SIGUSR2"] and 0 not in notices


def test_a_job_that_never_checks_ignores_the_notice_and_completes(tmp_path):
    """SIGUSR2 never kills a rank: a job without should_stop() just finishes."""
    run_dir = tmp_path / "run"
    process = start("run", EXAMPLES / "normalize.yaml", "--run-dir", run_dir)
    wait_for_file(run_dir / "logs" / "rank-1.log", 60, process)
    process.send_signal(signal.SIGUSR2)
    os.kill(rank_pid(run_dir, 0), signal.SIGUSR2)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert json.loads((run_dir / "status.json").read_text())["state"] == "COMPLETED"
