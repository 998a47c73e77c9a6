"""The governor (launcher/supervisor/governor.py), rule by rule: how an attempt's end is classified,
and when a failure that repeats is not tried again. End to end: tests/e2e/test_governor.py."""

from launcher.rundir import RunDirectory
from launcher.spec import JobSpec
from launcher.supervisor import governor
from launcher.supervisor.governor import AttemptEnd

TRACEBACK = 'Traceback (most recent call last):\n  File "/job/train.py", line 40, in step\n    raise ValueError\n'


def run_dir(tmp_path) -> RunDirectory:
    return RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")


def exception(attempt, step=40, where="ValueError at /job/train.py:40 in step", checkpoint=30):
    return AttemptEnd(attempt, "exception", where=where, step=step, checkpoint=checkpoint)


def test_the_programs_failure_twice_at_the_same_place_with_no_checkpoint_between_is_not_tried_again():
    why = governor.repeated(exception(0), exception(1))
    assert why == ("the program's own exception, twice at the same place after step 40: ValueError at "
                   "/job/train.py:40 in step (attempts 0 and 1, no checkpoint written between): not tried again")


def test_a_first_failure_a_new_place_or_a_new_checkpoint_is_tried_again():
    assert governor.repeated(None, exception(0)) is None
    assert governor.repeated(exception(0), exception(1, step=41)) is None
    assert governor.repeated(exception(0), exception(1, where="KeyError at /job/train.py:9 in load")) is None
    assert governor.repeated(exception(0, checkpoint=30), exception(1, checkpoint=35)) is None  # it got further


def test_a_first_checkpoint_at_step_0_is_a_checkpoint_written_between():
    """Attempt 0 wrote none, attempt 1 wrote step 0's: the next attempt starts later, so it is tried."""
    assert governor.repeated(exception(0, checkpoint=None), exception(1, checkpoint=0)) is None
    assert governor.repeated(exception(0, checkpoint=0), exception(1, checkpoint=0)) is not None  # nothing new


def test_the_machines_faults_are_always_tried_again():
    lost = AttemptEnd(1, "node_failure", step=40, checkpoint=30)
    assert governor.repeated(AttemptEnd(0, "node_failure", step=40, checkpoint=30), lost) is None
    assert governor.repeated(exception(0), AttemptEnd(1, "preemption", step=40, checkpoint=30)) is None
    assert governor.repeated(AttemptEnd(0, "cancelled"), AttemptEnd(1, "cancelled")) is None


def test_nothing_known_of_the_place_is_not_the_same_place():
    assert governor.repeated(AttemptEnd(0, "exception"), AttemptEnd(1, "exception")) is None


def test_a_script_that_never_reports_a_step_failing_twice_at_one_place_is_not_tried_again():
    """The place alone says it is the same failure: no step is needed (issue 55)."""
    where = "ValueError at /job/train.py:40 in step"
    previous, current = exception(0, step=None, checkpoint=None), exception(1, step=None, checkpoint=None)
    assert governor.repeated(previous, current) == (
        f"the program's own exception, twice at the same place: {where} (attempts 0 and 1, no checkpoint written "
        f"between): not tried again")
    elsewhere = exception(1, step=None, checkpoint=None, where="KeyError at /job/train.py:9 in load")
    assert governor.repeated(previous, elsewhere) is None


def test_an_exception_is_classified_by_its_type_and_innermost_frame_and_the_failing_ranks_step(tmp_path):
    run = run_dir(tmp_path)
    failure = {"first_failure": {"kind": "exception", "error": "ValueError: corrupt batch 3 on rank 1",
                                 "traceback": TRACEBACK, "step": 40, "source": "rank"}}
    end = governor.classify(2, failure, None, run, 0.0)
    assert end == AttemptEnd(2, "exception", where="ValueError at /job/train.py:40 in step", step=40, checkpoint=None)


def test_the_place_of_an_exception_is_the_innermost_frame_of_a_deep_traceback(tmp_path):
    """A job that raises in a function main calls: the frame that raised, not main's call of it (issue 55)."""
    deep = ('Traceback (most recent call last):\n  File "/job/train.py", line 90, in main\n    step(batch)\n'
            '  File "/job/model.py", line 12, in forward\n    return layer(x)\n'
            '  File "/job/train.py", line 40, in step\n    raise ValueError\n')
    failure = {"first_failure": {"kind": "exception", "error": "ValueError: corrupt batch", "traceback": deep,
                                 "source": "rank"}}
    assert governor.classify(0, failure, None, run_dir(tmp_path), 0.0).where == "ValueError at /job/train.py:40 in step"


def test_a_hang_is_classified_by_the_roll_calls_culprits_and_a_lost_node_as_the_machines(tmp_path):
    run = run_dir(tmp_path)
    run.log_event("checkpoint", step=30)
    failure = {"hang": {"roll_call": {"culprits": [{"rank": 1, "host": "node2", "where": "hangs.py:30 in read_batch"}]}}}
    end = governor.classify(0, failure, "hang", run, 0.0)
    assert (end.cause, end.where, end.checkpoint) == ("hang", "rank 1 hangs.py:30 in read_batch", 30)
    assert end.programs
    lost = governor.classify(0, failure, None, run, 0.0, machine_cause="node_failure")
    assert lost.cause == "node_failure" and not lost.programs


def test_a_collective_timeout_is_the_programs_hang_at_the_roll_calls_place(tmp_path):
    """A launcher collective that waited past collective_timeout: a hang of the program, so the same
    one twice is not tried again (issue 55)."""
    failure = {"hang": {"roll_call": {"culprits": [{"rank": 1, "where": "hangs.py:30 in read_batch"}]}}}
    ends = [governor.classify(attempt, failure, "collective_timeout", run_dir(tmp_path / str(attempt)), 0.0)
            for attempt in (0, 1)]
    assert (ends[0].cause, ends[0].where, ends[0].programs) == ("hang", "rank 1 hangs.py:30 in read_batch", True)
    assert governor.repeated(*ends) is not None


def test_an_exit_the_launcher_saw_is_the_programs_exit(tmp_path):
    failure = {"first_failure": {"source": "launcher", "exit_code": 4, "signal": None, "error": "exited with code 4"}}
    assert governor.classify(0, failure, None, run_dir(tmp_path), 0.0).cause == "exit"


def test_the_attempt_before_is_read_back_from_the_run_directory_as_a_requeued_batch_job_must(tmp_path):
    run = run_dir(tmp_path)
    governor.record(run, exception(0))
    governor.record(run, AttemptEnd(1, "node_failure", step=12))
    assert governor.previous_end(run, 2) == AttemptEnd(1, "node_failure", step=12)
    assert governor.previous_end(run, 1) == exception(0)
    assert governor.previous_end(run, 0) is None


def test_an_attempt_that_reports_nothing_completed_the_step_before_the_one_it_restored(tmp_path):
    """A hang at step 8 on every attempt: the second restores step 8 and hangs at once, reporting
    nothing; its last completed step is 7, as the first's was."""
    run = run_dir(tmp_path)
    run.log_event("restored", step=8)
    assert governor.last_step(run, 0.0) == 7
    assert governor.last_step(run, 1e12) is None
