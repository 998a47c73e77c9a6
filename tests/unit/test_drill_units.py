"""Unit tests of `jaxlaunch drill` (launcher/cli/drill_trials/): comparing results, choosing the points, and
scoring a faulted run from its run directory. The drill itself runs in tests/e2e/test_drill.py."""

import json

import numpy as np
import pytest

from launcher.cli import drill_trials as drills


def test_results_compare_bit_for_bit_or_within_a_tolerance_and_ignore_the_attempt():
    clean = {"loss": [0.5, 0.25], "params": {"w": np.array([1.0, 2.0], np.float32)}, "attempt": 0}
    again = {"loss": [0.5, 0.25], "params": {"w": np.array([1.0, 2.0], np.float32)}, "attempt": 1}
    assert drills.same_result(clean, again, 0.0, ignore=("attempt",)) == (True, "")
    assert drills.same_result(clean, again, 0.0) == (False, "attempt: 0 != 1")
    nudged = {**again, "params": {"w": np.array([1.0, 2.0 + 1e-6], np.float32)}}
    equal, where = drills.same_result(clean, nudged, 0.0, ignore=("attempt",))
    assert not equal and where.startswith("params.w: differs")
    assert drills.same_result(clean, nudged, 1e-5, ignore=("attempt",))[0]
    assert drills.same_result(clean, {**again, "extra": 1}, 0.0, ignore=("attempt",))[1].startswith("the result: keys")


def make_drill(tmp_path, steps=range(10), checkpoints=(4, 8), slowest=0.1):
    drill = drills.Drill("job.yaml", [], [], tmp_path, ["kill", "preempt", "hang"], 2, seed=7, tolerance=0.0)
    drill.clean = {"run_dir": str(tmp_path / "clean"), "state": "COMPLETED", "seconds": 10.0, "steps": list(steps),
                   "checkpoints": list(checkpoints), "checkpoint_interval": 4 if checkpoints else None,
                   "slowest_step": slowest}
    return drill


def test_the_plan_is_the_seeds_and_hits_steps_the_clean_run_reached(tmp_path):
    first, second = make_drill(tmp_path), make_drill(tmp_path)
    first.plan(2)
    second.plan(2)
    assert [(t.fault, t.point, t.rank, t.target_step) for t in first.trials] == \
        [(t.fault, t.point, t.rank, t.target_step) for t in second.trials]  # the seed decides
    assert [t.fault for t in first.trials] == ["kill", "kill", "preempt", "preempt", "hang", "hang"]
    assert all(0 <= t.target_step <= 9 and t.rank in (0, 1) for t in first.trials)
    quiet = make_drill(tmp_path, steps=[], checkpoints=())
    quiet.plan(2)  # a job that never reports: faulted at a time instead
    assert all(t.point == "time" and 3.0 <= t.target_seconds <= 7.0 for t in quiet.trials)


def write_run(run_dir, events, reports, state="COMPLETED", result=None, failures=()):
    """A run directory as the supervisor leaves it; `failures`: each earlier attempt's failure.json."""
    run_dir.mkdir(parents=True)
    for failure in failures:
        (run_dir / "logs" / f"attempt-{failure['attempt']}").mkdir(parents=True)
        (run_dir / "logs" / f"attempt-{failure['attempt']}" / "failure.json").write_text(json.dumps(failure))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"kind": "metrics", "metrics": {}, **r}) + "\n"
                                                   for r in reports))
    (run_dir / "status.json").write_text(json.dumps({"state": state}))
    if result is not None:
        (run_dir / "result.json").write_text(json.dumps(result))


def test_a_killed_rank_that_restarted_from_its_checkpoint_passes(tmp_path):
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [], result={"loss": 1.0, "attempt": 0})
    trial = drills.Trial("kill", "step", 1, target_step=6, injected_at=100.0, run_dir=str(tmp_path / "kill-1"))
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": "FAILED", "time": 101.5},
              {"event": "attempt_started", "attempt": 1, "time": 101.6},
              {"event": "restored", "step": 4, "time": 104.0}, {"event": "attempt_ended", "attempt": 1, "time": 110.0}]
    reports = [{"step": s, "time": 95.0 + s * 0.5} for s in range(7)] + \
              [{"step": s, "time": 105.0 + s * 0.1} for s in range(4, 10)]
    write_run(tmp_path / "kill-1", events, reports, result={"loss": 1.0, "attempt": 1},
              failures=[killed(attempt=0, rank=1)])
    drill.score(trial, tmp_path / "kill-1")
    assert trial.detected and trial.detect_seconds == 1.5 and trial.faulted_state == "FAILED"
    assert trial.recover_seconds == 5.6 and trial.steps_lost == 3 and trial.same_result and trial.passed, trial.why
    assert trial.blamed == [1]


def killed(attempt, rank, error="killed by SIGKILL"):
    return {"attempt": attempt, "state": "FAILED", "reason": "failed", "summary": f"rank {rank} on vm failed first: {error}",
            "first_failure": {"rank": rank, "error": error}}


def watchdog_stop(attempt, culprit):
    return {"attempt": attempt, "state": "TIMEOUT", "reason": "hang",
            "summary": f"no progress for 5 s; rank {culprit} on vm held it up, stopped",
            "hang": {"ranks": [], "roll_call": {"line": "...", "culprits": [{"rank": culprit, "why": "stopped"}]}}}


def _hang_trial(tmp_path, faulted_rank, failure):
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [])
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": failure["state"], "time": 108.0},
              {"event": "attempt_started", "attempt": 1, "time": 108.5},
              {"event": "restored", "step": 4, "time": 110.0}, {"event": "attempt_ended", "attempt": 1, "time": 115.0}]
    reports = [{"step": s, "time": 95.0 + s * 0.5} for s in range(7)] + \
              [{"step": s, "time": 111.0 + s * 0.1} for s in range(4, 10)]
    write_run(tmp_path / "hang-1", events, reports, failures=[failure])
    trial = drills.Trial("hang", "step", faulted_rank, target_step=6, injected_at=100.0, run_dir=str(tmp_path / "hang-1"))
    drill.score(trial, tmp_path / "hang-1")
    return trial


def test_a_hang_the_watchdog_stopped_naming_the_stopped_rank_passes(tmp_path):
    trial = _hang_trial(tmp_path, 1, watchdog_stop(0, culprit=1))
    assert trial.passed and trial.detected and trial.detect_seconds == 8.0 and trial.blamed == [1], trial.why


def test_a_hang_that_something_else_ended_is_not_detected(tmp_path):
    """Issue 51, finding 7: rank 1 stopped in its compile, JAX's coordination service aborted the healthy
    rank 0 after 93 s, failure.json blamed rank 0 (killed by SIGABRT), the restart completed: it scored PASS."""
    trial = _hang_trial(tmp_path, 1, killed(attempt=0, rank=0, error="killed by SIGABRT"))
    assert not trial.passed and not trial.detected and trial.detect_seconds is None
    assert trial.why == ["the hang was not detected by jaxlaunch: the attempt it hit ended FAILED (failed: rank 0 on "
                         "vm failed first: killed by SIGABRT)"]


def test_a_hang_the_watchdog_blamed_on_a_healthy_rank_fails(tmp_path):
    """Issue 51, finding 5 as the drill sees it: rank 0 stopped, the stop line named rank 1."""
    trial = _hang_trial(tmp_path, 0, watchdog_stop(0, culprit=1))
    assert not trial.passed and trial.detected and trial.blamed == [1]
    assert trial.why == ["jaxlaunch named rank(s) 1, not the faulted rank 0: no progress for 5 s; rank 1 on vm held "
                         "it up, stopped"]


def test_a_hang_whose_stopped_rank_alone_did_not_answer_the_roll_call_passes(tmp_path):
    """The watchdog's stop for a rank that stopped telling: the roll-call has no culprit, but the stopped
    rank is the one rank that did not answer it (plain_loop.py's hang trial)."""
    silent = {"attempt": 0, "state": "TIMEOUT", "reason": "hang", "summary": "rank 0 (never told) stopped telling",
              "hang": {"ranks": [{"rank": 0, "answered": False}, {"rank": 1, "answered": False, "left_main": True}],
                       "roll_call": {"line": "...", "culprits": []}}}
    assert _hang_trial(tmp_path, 0, silent).passed
    every = {**silent, "hang": {"ranks": [{"rank": 0, "answered": False}, {"rank": 1, "answered": False}]}}
    trial = _hang_trial(tmp_path / "every", 0, every)
    assert not trial.passed and trial.why[0].startswith("jaxlaunch named no rank, not the faulted rank 0")  # nobody answered


def test_a_kill_jaxlaunch_blamed_on_another_rank_fails(tmp_path):
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [])
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": "FAILED", "time": 101.5}]
    write_run(tmp_path / "kill-1", events, [{"step": 6, "time": 99.0}], state="FAILED",
              failures=[killed(attempt=0, rank=1)])
    trial = drills.Trial("kill", "step", 0, target_step=6, injected_at=100.0, run_dir=str(tmp_path / "kill-1"))
    drill.score(trial, tmp_path / "kill-1")
    assert not trial.passed and any(why.startswith("jaxlaunch named rank(s) 1, not the faulted rank 0") for why in trial.why)


def test_a_job_that_ignores_the_notice_and_never_checkpoints_fails_and_says_why(tmp_path):
    drill = make_drill(tmp_path, checkpoints=())
    write_run(tmp_path / "clean", [], [], result={"loss": 1.0})
    trial = drills.Trial("preempt", "step", 0, target_step=5, injected_at=100.0, run_dir=str(tmp_path / "p"))
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "notice", "time": 100.1}, {"event": "attempt_ended", "attempt": 0, "state": "COMPLETED",
                                                   "time": 103.0}]
    write_run(tmp_path / "p", events, [{"step": s, "time": 95.0 + s} for s in range(10)], result={"loss": 1.0})
    drill.score(trial, tmp_path / "p")
    assert not trial.passed and not trial.detected
    assert any("did not checkpoint and stop on the preemption notice" in why for why in trial.why)


# --- the Slurm side of the faults (launcher/backends/slurm/faults.py), Slurm's answers faked ------------

JOB_7 = "JobId=7 JobState=RUNNING NodeList=node[1-2] BatchHost=node2\n"  # scontrol show job 7


def test_the_node_fault_downs_the_ranks_node_never_the_batch_node(fake_slurm, tmp_path):
    from launcher.backends import get_backend
    from launcher.rundir import RunDirectory
    from launcher.spec import JobSpec

    run = RunDirectory.create(JobSpec(name="d", entrypoint="job.py:main", nodes=2), tmp_path / "run")
    fake_slurm.answers.update({"scontrol show job": JOB_7, "scontrol show hostnames": "node1\nnode2\n",
                               "scontrol update": ""})
    calls = fake_slurm.calls
    backend = get_backend("slurm")
    assert backend.inject_fault("node", "7", run.path, rank=1, processes_per_node=1) == "node1"  # rank 1's is the batch node
    assert calls[-1][:4] == ["scontrol", "update", "nodename=node1", "state=down"]
    backend.end_fault("node1")
    assert calls[-1] == ["scontrol", "update", "nodename=node1", "state=resume"]


def test_a_fault_slurm_refuses_says_why(fake_slurm, tmp_path):
    from launcher.backends import get_backend
    from fake_slurm import refused
    from launcher.backends.slurm.faults import FaultNotInjected

    fake_slurm.answers.update({"scontrol show job": JOB_7, "scontrol show hostnames": "node1\nnode2\n",
                               "scontrol update": refused("Invalid user id"),
                               "scancel --batch": refused("Job has finished", ["scancel"]),
                               "srun --jobid=7": refused("Job step creation disabled", ["srun"])})
    backend = get_backend("slurm")
    with pytest.raises(FaultNotInjected, match="cannot set node1 DOWN .needs Slurm operator rights.: Invalid user id"):
        backend.inject_fault("node", "7", tmp_path, rank=0, processes_per_node=1)
    with pytest.raises(FaultNotInjected, match="scancel failed: Job has finished"):
        backend.inject_fault("preempt", "7", tmp_path, rank=0, processes_per_node=1)
    with pytest.raises(FaultNotInjected, match="rank 0's process was not found on the job's nodes: Job step creation"):
        backend.inject_fault("kill", "7", tmp_path, rank=0, processes_per_node=1)


def test_the_scorecard_shows_the_step_the_fault_really_hit(tmp_path):
    """Issue 44, item 12: the careless drill's AT column said step 0 (the point chosen) while the job,
    polled every 0.1 s, was at step 3 when the fault hit, and 3 steps were computed again."""
    drill = make_drill(tmp_path)
    trial = drills.Trial("kill", "start", 1, target_step=0, injected_step=3, run_dir=str(tmp_path / "kill-1"))
    drill.trials = [trial]
    assert "step 3 (start)" in drill.scorecard()
    trial.injected_step = None
    assert "step 0 (start)" in drill.scorecard()


# --- the repeat fault: the program's own hang at one step on every attempt; the governor must stop it ----

def _repeat_run(tmp_path, attempts, governed):
    events = []
    for attempt in range(attempts):
        events += [{"event": "attempt_started", "attempt": attempt, "time": 100.0 + 10 * attempt},
                   {"event": "attempt_ended", "attempt": attempt, "state": "TIMEOUT", "time": 108.0 + 10 * attempt}]
    if governed:
        events.append({"event": "governor", "decision": "stopped", "time": 108.0 + 10 * (attempts - 1),
                       "why": "the program's own hang, twice at the same place after step 5: not tried again"})
    write_run(tmp_path / "repeat-1", events, [{"step": s, "time": 101.0 + s * 0.1} for s in range(6)],
              state="TIMEOUT", failures=[watchdog_stop(attempt, culprit=1) for attempt in range(attempts)])
    trial = drills.Trial("repeat", "step", 1, target_step=6, injected_at=100.0, injected_step=6,
                         run_dir=str(tmp_path / "repeat-1"))
    make_drill(tmp_path).score_repeat(trial, tmp_path / "repeat-1")
    return trial


def test_a_repeated_hang_the_governor_stopped_after_two_attempts_passes(tmp_path):
    trial = _repeat_run(tmp_path, 2, governed=True)
    assert trial.passed and trial.detected and trial.attempts == 2 and trial.detect_seconds == 8.0, trial.why
    assert trial.notes == ["the governor stopped it after 2 attempts: the program's own hang, twice at the same "
                           "place after step 5: not tried again"]


def test_a_repeated_hang_tried_on_every_attempt_fails_and_says_the_governor_did_not_stop_it(tmp_path):
    trial = _repeat_run(tmp_path, 4, governed=False)
    assert not trial.passed and trial.attempts == 4
    assert trial.why == ["the same hang, at step 6 on every attempt, was tried 4 times: the governor did not stop "
                         "it (is stop_repeated_failures: false in the spec?)"]


def test_a_governor_that_stopped_only_after_a_third_attempt_fails(tmp_path):
    trial = _repeat_run(tmp_path, 3, governed=True)
    assert not trial.passed and trial.why == ["the governor stopped it only after 3 attempts, not 2"]


def test_a_job_that_reports_no_steps_cannot_have_the_repeat_fault(tmp_path):
    drill = make_drill(tmp_path, steps=[], checkpoints=())
    drill.faults = ["repeat"]
    drill.plan(2)
    trial = drill.trials[0]
    drill._run_repeat(trial, tmp_path / "r", tmp_path / "r.log", [], 10.0)
    assert trial.why == ["repeat needs a job that reports its steps (ctx.report): this one reports none"]
    assert not trial.passed


def test_a_one_off_fault_the_governor_stopped_fails_with_its_reason(tmp_path):
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [])
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": "FAILED", "time": 101.0},
              {"event": "governor", "decision": "stopped", "why": "the program's own exit, twice", "time": 102.0}]
    write_run(tmp_path / "kill-1", events, [{"step": s, "time": 95.0 + s * 0.5} for s in range(7)], state="FAILED")
    trial = drills.Trial("kill", "step", 1, target_step=6, injected_at=100.0, run_dir=str(tmp_path / "kill-1"))
    drill.score(trial, tmp_path / "kill-1")
    assert not trial.passed and "the governor did not try again: the program's own exit, twice" in trial.why


def test_the_planted_hang_names_one_rank_and_one_step():
    from launcher.rank.drill_fault import HANG_ENV, planted_hang

    assert planted_hang(1, {HANG_ENV: "1:40"}) == 40
    assert planted_hang(0, {HANG_ENV: "1:40"}) is None
    assert planted_hang(1, {}) is None and planted_hang(1, {HANG_ENV: "x:40"}) is None
    assert planted_hang(1, {HANG_ENV: "1"}) is None


def test_the_planted_hang_blocks_the_report_of_its_step_only(monkeypatch):
    from launcher.rank import progress
    from launcher.rank.drill_fault import HANG_ENV

    monkeypatch.setenv(HANG_ENV, "0:3")
    reporter = progress.ProgressReporter(0)
    hung = []
    monkeypatch.setattr(progress, "hang_in_the_programs_place", hung.append)
    for step in range(5):
        reporter.report(step)
    assert hung == [3] and reporter.last_step == 4
    assert progress.ProgressReporter(1).hang_at is None


# --- steps lost by a program that reports none: read from its output (cli/drill_trials/printed_steps.py) ---

def _script_kill(tmp_path, before: str, after: str):
    """A kill trial of a script that never reports: attempt 0 printed `before`, the restart `after`."""
    drill = make_drill(tmp_path, steps=[], checkpoints=())
    write_run(tmp_path / "clean", [], [])
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": "FAILED", "time": 101.5},
              {"event": "attempt_started", "attempt": 1, "time": 101.6},
              {"event": "attempt_ended", "attempt": 1, "state": "COMPLETED", "time": 110.0}]
    write_run(tmp_path / "kill-1", events, [], failures=[killed(attempt=0, rank=1)])
    (tmp_path / "kill-1" / "logs" / "attempt-0" / "rank-1.log").write_text(before)
    (tmp_path / "kill-1" / "logs" / "rank-1.log").write_text(after)
    trial = drills.Trial("kill", "time", 1, target_seconds=5.0, injected_at=100.0, run_dir=str(tmp_path / "kill-1"))
    drill.score(trial, tmp_path / "kill-1")
    drill.trials = [trial]
    return trial, drill


def test_a_script_that_started_over_after_a_kill_lost_the_steps_its_output_shows(tmp_path):
    """Issue 51, finding 8: STEPS LOST 0 for a kill after which the script restarted from step 0."""
    trial, _ = _script_kill(tmp_path, "step 0 loss 1.0\nstep 20 loss 0.8\nstep 100 loss 0.4\n",
                            "step 0 loss 1.0\nstep 20 loss 0.8\nstep 180 loss 0.1\ndone\n")
    assert trial.steps_lost == 100 and trial.steps_lost_from == "output" and not trial.passed
    assert trial.why == ["the job started over after the restart: at least 100 steps computed again (from its "
                         "output: rank 1 printed step 100 in attempt 0 and step 0 first in attempt 1); it does not "
                         "resume from a checkpoint"]


def test_a_script_that_resumed_from_its_own_checkpoint_passes_with_the_steps_its_output_shows(tmp_path):
    trial, _ = _script_kill(tmp_path, "step 0\nstep 20\nstep 100\n", "resumed at step 80\nstep 100\nstep 180\n")
    assert trial.passed and trial.steps_lost == 20, trial.why
    assert any(note.startswith("at least 20 steps computed again, read from its output") for note in trial.notes)


def test_steps_lost_by_a_script_whose_output_names_no_step_are_unknown(tmp_path):
    trial, drill = _script_kill(tmp_path, "loss 1.0\nloss 0.5\n", "loss 1.0\ndone\n")
    assert trial.steps_lost is None and trial.steps_lost_from == "unknown" and trial.passed, trial.why
    row = next(line for line in drill.scorecard().splitlines() if line.startswith("PASS"))
    assert "unknown" in row
