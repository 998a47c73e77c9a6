"""Hangs anywhere, named and ended (issue 33), end to end under a real mpirun: a global-mesh job
(jax_distributed: true, the cross-process reduction inside one jit, no launcher collective) whose
rank 1 stops entering the step, deadlocks at a barrier or in sync_global_devices, or blocks in a
checkpoint read; the same job healthy under load, and with a compile longer than hang_timeout."""

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import TEST_JOBS, jaxlaunch
from supervision_helpers import assert_no_process_survives

pytestmark = pytest.mark.e2e
SPEC = TEST_JOBS / "hangs.yaml"
HANG_TIMEOUT = 4


def run_hangs(run_dir, *overrides, timeout=150):
    args = ["run", SPEC, "--run-dir", run_dir, "--set", f"hang_timeout={HANG_TIMEOUT}"]
    for override in overrides:
        args += ["--set", override]
    started = time.time()
    result = jaxlaunch(*args, timeout=timeout)
    return result, time.time() - started


def stalled_at(run_dir) -> float:
    return float((run_dir / "stalled").read_text().split()[0])


def assert_named(run_dir, result, kind_words, frame):
    """Exit 124 (TIMEOUT), the roll-call names rank 1 and its frame, everywhere people look."""
    assert result.returncode == 124, result.stderr[-3000:]
    failure = json.loads((run_dir / "failure.json").read_text())
    roll = failure["hang"]["roll_call"]
    assert [c["rank"] for c in roll["culprits"]] == [1], roll
    culprit = roll["culprits"][0]
    assert culprit["host"] and frame in culprit["where"], culprit
    assert f"rank 1 on {culprit['host']} is elsewhere: {kind_words}" in roll["line"], roll["line"]
    assert f"rank 1 on {culprit['host']} held it up" in failure["summary"]
    assert f"roll-call: {roll['line']}" in result.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "TIMEOUT" and "held it up" in status["reason"]
    assert_no_process_survives(run_dir)
    return failure


def test_a_rank_that_stops_entering_the_jitted_step_is_named_within_hang_timeout(tmp_path):
    run_dir = tmp_path / "run"
    result, _ = run_hangs(run_dir, "params.how=loader")
    ended = (run_dir / "status.json").stat().st_mtime
    failure = assert_named(run_dir, result, "in its own code at hangs.py", "in read_batch")
    assert failure["reason"] == "hang"
    assert failure["hang"]["roll_call"]["waiting"]["kind"] == "xla"  # rank 0 waits inside XLA's all-reduce
    assert "calling train_step" in failure["hang"]["roll_call"]["line"]
    took = ended - stalled_at(run_dir)
    assert took < HANG_TIMEOUT + 10, f"the job ended {took:.1f} s after the stall"


def test_the_same_job_without_a_stall_completes_under_load_with_no_false_alarm(tmp_path):
    """Two busy processes on the 2-core machine while the job runs with a small hang_timeout:
    slower steps, never a hang; the result equals an unloaded run's (the job's numbers are fixed)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        result, _ = run_hangs(tmp_path / "loaded", "params.how=none", "params.steps=40")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no rank made progress" not in result.stderr
    quiet, _ = run_hangs(tmp_path / "quiet", "params.how=none", "params.steps=40")
    assert quiet.returncode == 0
    loaded = json.loads((tmp_path / "loaded" / "result.json").read_text())
    assert loaded["w"] == json.loads((tmp_path / "quiet" / "result.json").read_text())["w"]
    events = [json.loads(line) for line in (tmp_path / "quiet" / "events.jsonl").read_text().splitlines()]
    shutdown = next(e for e in events if e["event"] == "jax_distributed_shutdown")  # a clean, bounded shutdown
    assert shutdown["seconds"] < 60


def test_a_rank_deadlocked_in_its_threads_while_the_others_wait_at_a_barrier_is_named(tmp_path):
    """launcher.barrier('epoch', timeout=4): the barrier's own timeout stops the job, names the ranks
    that never arrived, and the roll-call names the deadlocked rank's frame."""
    run_dir = tmp_path / "run"
    result, _ = run_hangs(run_dir, "params.how=deadlock", "params.barrier_timeout=4", "hang_timeout=60")
    failure = assert_named(run_dir, result, "in its own code at hangs.py", "in deadlock_in_own_threads")
    assert failure["reason"] == "collective_timeout"
    assert failure["hang"]["never_arrived"] == [1]
    assert "barrier 'epoch'" in failure["hang"]["collective"]["name"]
    assert failure["hang"]["roll_call"]["waiting"]["kind"] == "barrier"


def test_a_rank_deadlocked_while_the_others_wait_in_sync_global_devices_is_named(tmp_path):
    run_dir = tmp_path / "run"
    result, _ = run_hangs(run_dir, "params.how=sync")
    failure = assert_named(run_dir, result, "in its own code at hangs.py", "in deadlock_in_own_threads")
    assert failure["hang"]["roll_call"]["waiting"]["kind"] == "barrier"
    assert "sync_global_devices" in failure["hang"]["roll_call"]["line"]


def test_a_rank_stuck_in_a_checkpoint_read_is_named_after_the_checkpoint_allowance(tmp_path):
    from launcher.supervisor.watchdog import CHECKPOINT_FACTOR

    run_dir = tmp_path / "run"
    result, _ = run_hangs(run_dir, "params.how=checkpoint_read")
    ended = (run_dir / "status.json").stat().st_mtime
    failure = assert_named(run_dir, result, "in a checkpoint save or restore at hangs.py", "read_blocked_checkpoint")
    assert "checkpoint save or restore" in failure["summary"]
    took = ended - stalled_at(run_dir)
    assert CHECKPOINT_FACTOR * HANG_TIMEOUT - 1 < took < CHECKPOINT_FACTOR * HANG_TIMEOUT + 10, took


def test_a_compile_longer_than_hang_timeout_is_not_a_hang(tmp_path):
    """The step at stall_at needs a long compile (thousands of chained ops), longer than
    hang_timeout=4: every rank's monitor says it is compiling, and the clock stands. How long a
    compile takes depends on the machine and its load (3000 ops took 3.8 s on an idle CI machine,
    6 s under load), so the test makes its own precondition true: while the compile was not longer
    than hang_timeout, it runs again with twice the ops."""
    ops = 5000
    for tries in range(3):
        run_dir = tmp_path / f"run-{ops}"
        result, _ = run_hangs(run_dir, "params.how=slow_compile", f"params.ops={ops}")
        assert result.returncode == 0, result.stderr[-3000:]
        stalled = stalled_at(run_dir)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [(m["step"], m["time"]) for m in metrics if m.get("kind") == "metrics"]
        after = next(t for step, t in steps if step == 8)  # the step that needed the compile
        if after - stalled > HANG_TIMEOUT:
            break
        ops *= 2
    assert after - stalled > HANG_TIMEOUT, f"the compile took only {after - stalled:.1f} s: the test proves nothing"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert not any(e.get("event") == "attempt_ended" and e.get("state") != "COMPLETED" for e in events)
    assert os.path.exists(run_dir / "result.json")


def test_a_hang_restarts_the_job_locally_and_the_restart_loads_its_executables_from_the_cache(tmp_path):
    """max_restarts: 1: attempt 0 hangs (rank 1 stuck in its loader) and is stopped with a roll-call;
    attempt 1 resumes from the checkpoint, loads its executables from RUN_DIR/compile-cache (issue 34's
    cache, shared by attempts) and completes."""
    run_dir = tmp_path / "run"
    result, _ = run_hangs(run_dir, "params.how=loader", "max_restarts=1")
    assert result.returncode == 0, result.stderr[-3000:]
    hang = json.loads((run_dir / "logs" / "attempt-0" / "failure.json").read_text())
    assert hang["reason"] == "hang" and [c["rank"] for c in hang["hang"]["roll_call"]["culprits"]] == [1]
    assert json.loads((run_dir / "result.json").read_text())["attempt"] == 1
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    cache = [e for e in events if e["event"] == "compile_cache"]
    assert len(cache) == 1 and cache[0]["hits"] > 0, cache  # attempt 1's, the only one whose main returned
    folder = run_dir / "compile-cache"
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and any(folder.rglob("*-cache"))
    # issue 34's start-up budget: each attempt's way to its first report, from real events
    shown = jaxlaunch("goodput", run_dir)
    assert shown.returncode == 0 and "start-up budget" in shown.stdout, shown.stdout + shown.stderr
    budget = [line.split() for line in shown.stdout.splitlines()[-2:]]
    assert [row[0] for row in budget] == ["0", "1"] and all(row[-1] != "-" for row in budget), shown.stdout
    verbose = jaxlaunch("status", "-v", run_dir).stdout
    assert "attempt 1: " in verbose and "s to its first report (" in verbose and "compile" in verbose, verbose
