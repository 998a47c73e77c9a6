"""The supervisor's decisions, fast: a small Python script stands in for mpirun and its ranks (it
speaks the control protocol as real ranks do, and writes their error records and result.json:
tests/supervision_helpers.py), so each test runs the real Supervisor loop in well under a second,
without MPI or JAX. What the supervisor asks of the place its job runs (nodes lost or failing,
spares, requeues, what a notice or a cancel leads to) is answered by one scripted Allocation
(tests/fake_allocation.py); SlurmAllocation's own answers: test_slurm_allocation.py. Also the rank
side of notices and early exits (monitor.py, preemption.py) with a made-up collective tracker."""

import dataclasses
import importlib
import json
import os
import signal
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from fake_allocation import ScriptedAllocation
from launcher.supervisor import channel as supervisor_channel
from launcher.rundir import RunDirectory
from launcher.rank import monitor, preemption
from launcher.environment import RUN_DIR_ENV
from launcher.states import JobState
from launcher.supervisor import root_cause
from launcher.supervisor.supervise import Outcome, Supervisor, describe_outcome, exit_code_for
from supervision_helpers import fake_launcher, make_run, quick_stops, seen, status, supervisor  # noqa: F401 (fixtures)

supervise = importlib.import_module("launcher.supervisor.supervise")  # the package exports a function by that name
attempt = importlib.import_module("launcher.supervisor.attempt")  # one attempt: where its timings are read


# --- exit codes and states ------------------------------------------------------------------------

@pytest.mark.parametrize("state, stop_signal, code", [
    ("COMPLETED", None, 0), ("REQUEUED", None, 0), ("PREEMPTED", None, 75), ("TIMEOUT", None, 124),
    ("FAILED", None, 1), ("CANCELLED", signal.SIGINT, 130), ("CANCELLED", signal.SIGHUP, 129),
    ("CANCELLED", None, 143)])
def test_exit_code_of_each_final_state(state, stop_signal, code):
    assert exit_code_for(state, stop_signal) == code


@pytest.mark.parametrize("mode, state, code", [("left_early", "FAILED", 1),
                                               ("collective_timeout", "TIMEOUT", 124)])
def test_a_ranks_stop_request_ends_the_job_in_its_state(fake_launcher, tmp_path, mode, state, code):
    spec, run = make_run(tmp_path, collective_timeout=3)
    started = time.monotonic()
    outcome = supervisor(fake_launcher, spec, run, mode).supervise()
    assert time.monotonic() - started < 30  # stopped at the request, not after the fake's 60 s
    assert (outcome.state, outcome.exit_code, outcome.attempts) == (state, code, 1)
    failure = json.loads(run.failure_file.read_text())
    assert failure["state"] == state and failure["reason"] == mode
    assert status(run)["state"] == state and status(run)["exit_code"] == code
    if mode == "left_early":  # the rank that left is the cause, found by the watchdog
        assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["source"] == "watchdog"
        assert failure["summary"].startswith("rank 1 failed first: left main early: rank 1 left main after 1")
        assert failure["torn_down_ranks"] == [0]


def test_the_earliest_stop_request_is_the_reason(tmp_path):
    spec, run = make_run(tmp_path)
    sup = Supervisor(spec, run, [], {})
    sup.channel = supervisor_channel.ControlServer(run)  # an attempt's channel (not started: no socket)
    for rank, reason, at in ((0, "collective_timeout", 20.0), (1, "left_early", 10.0), (2, "collective_timeout", 30.0)):
        sup.channel._records["abort"][rank] = {"rank": rank, "reason": reason, "message": f"rank {rank}'s request",
                                               "time": at}
    assert sup._why_stop() == ("left_early", "rank 1's request")


def test_a_launcher_that_hangs_after_reporting_a_dead_rank_is_ended(fake_launcher, tmp_path, monkeypatch):
    monkeypatch.setattr(attempt, "LAUNCHER_EXIT_SECONDS", 0.5)
    spec, run = make_run(tmp_path)
    started = time.monotonic()
    outcome = supervisor(fake_launcher, spec, run, "hang_after_a_rank_died").supervise()
    assert time.monotonic() - started < 20  # not the fake's 60 s
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    failure = json.loads(run.failure_file.read_text())
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["exit_code"] == 14
    assert any(e["event"] == "launcher_hung" for e in run.read_events())


def test_a_launcher_that_hangs_after_its_ranks_died_in_mpi_init_is_ended(fake_launcher, tmp_path, monkeypatch):
    """prterun reports no dead rank in that case (its words are the ranks' own), and was seen to hang
    for good under load: 1 run in 7 of the pml=nonexistent test, which then ran into pytest's timeout."""
    monkeypatch.setattr(attempt, "LAUNCHER_EXIT_SECONDS", 0.5)
    spec, run = make_run(tmp_path)
    started = time.monotonic()
    outcome = supervisor(fake_launcher, spec, run, "hang_after_mpi_init_failed").supervise()
    assert time.monotonic() - started < 20  # not the fake's 60 s
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    assert any(e["event"] == "launcher_hung" for e in run.read_events())


def test_the_spec_timeout_ends_the_job_with_code_124_and_no_restart(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path, timeout=1, max_restarts=2)
    outcome = supervisor(fake_launcher, spec, run, "hang").supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("TIMEOUT", 124, 1)
    assert json.loads(run.failure_file.read_text())["reason"] == "timeout"
    assert status(run)["attempts"] == 1 and status(run)["restarts"] == 0
    assert not (run.path / "seen-attempt-1.json").exists()


def test_a_cancel_ends_the_job_with_128_plus_the_signal_and_no_restart(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path, max_restarts=2)
    caught = []
    # Only if the supervisor failed to install its handler: keep pytest alive.
    guard = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))
    try:
        outcome = supervisor(fake_launcher, spec, run, "cancel_me").supervise()
    finally:
        signal.signal(signal.SIGTERM, guard)
    assert caught == []
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("CANCELLED", 143, 1)
    assert json.loads(run.failure_file.read_text())["summary"] == "cancelled by SIGTERM"
    assert status(run)["state"] == "CANCELLED" and status(run)["exit_code"] == 143


def test_a_stop_on_only_some_ranks_is_not_a_preemption(fake_launcher, tmp_path):
    """PREEMPTED means every rank checkpointed at the same agreed step; one rank that stopped while
    another returned without stopping (and no result) is a failure, not a run to resume."""
    spec, run = make_run(tmp_path)
    outcome = supervisor(fake_launcher, spec, run, "half_stopped").supervise()
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    assert json.loads(run.failure_file.read_text())["reason"] == "failed"


def test_a_launcher_exiting_0_before_every_rank_finished_main_is_a_failure(fake_launcher, tmp_path):
    """srun returns 0 when a task vanished with code 0: rank 0's result alone is not success."""
    spec, run = make_run(tmp_path)
    outcome = supervisor(fake_launcher, spec, run, "one_vanished").supervise()
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    failure = json.loads(run.failure_file.read_text())
    assert failure["summary"] == ("the launcher exited without an error, but not every rank finished main or "
                                  "rank 0 wrote no result")
    assert failure["launcher"]["exit_code"] == 0


def test_the_first_stop_signal_is_the_one_the_job_is_cancelled_by(tmp_path):
    """Ctrl-C, then a SIGTERM while the job is being torn down: cancelled by SIGINT, exit 130."""
    spec, run = make_run(tmp_path)
    sup = Supervisor(spec, run, [], {})
    sup._on_signal(signal.SIGINT, None)
    sup._on_signal(signal.SIGTERM, None)
    assert sup._why_stop() == ("cancelled", "cancelled by Ctrl-C (SIGINT)")
    assert exit_code_for("CANCELLED", sup.stop_signal) == 130


def test_a_cancel_says_who_cancelled_in_words(tmp_path):
    """Issue 44, item 12: `status` after `jaxlaunch cancel` said 'cancelled by SIGTERM'."""
    from launcher.states import CANCEL_EVENT

    spec, run = make_run(tmp_path)
    sup = Supervisor(spec, run, [], {})
    sup._on_signal(signal.SIGTERM, None)
    run.log_event(CANCEL_EVENT)
    assert sup._why_stop() == ("cancelled", "cancelled with jaxlaunch cancel")
    other = Supervisor(spec, run, [], {})
    other.launched = 1e12  # the cancel event belongs to an earlier launch
    other._on_signal(signal.SIGTERM, None)
    assert other._why_stop() == ("cancelled", "cancelled by SIGTERM")


# --- restarts -------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_restarts", [0, 1, 2])
def test_max_restarts_is_the_number_of_restarts_after_the_first_attempt(fake_launcher, tmp_path, max_restarts):
    spec, run = make_run(tmp_path, max_restarts=max_restarts)
    sup = supervisor(fake_launcher, spec, run, "fail")
    outcome = sup.supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("FAILED", 1, max_restarts + 1)
    assert status(run)["attempts"] == max_restarts + 1 and status(run)["restarts"] == max_restarts
    assert [line for line in sup.echoed if "restarting" in line] == [
        f"jaxlaunch: restarting the job ({k} of {max_restarts} restarts)" for k in range(1, max_restarts + 1)]
    failure = json.loads(run.failure_file.read_text())
    assert failure["attempt"] == max_restarts
    assert failure["first_failure"]["error"] == f"RuntimeError: attempt {max_restarts} fails"
    # every earlier attempt's logs and failure.json are kept apart
    for attempt in range(max_restarts):
        kept = json.loads((run.logs / f"attempt-{attempt}" / "failure.json").read_text())
        assert kept["attempt"] == attempt


def test_a_restart_gets_the_next_attempt_number_and_counts_one_restart(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path, max_restarts=3)
    outcome = supervisor(fake_launcher, spec, run, "fail_first").supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("COMPLETED", 0, 2)
    assert seen(run, 0)["attempt"] == 0 and seen(run, 1)["attempt"] == 1
    assert seen(run, 1)["status"]["attempts"] == 2 and seen(run, 1)["status"]["restarts"] == 1
    assert status(run)["state"] == "COMPLETED" and status(run)["restarts"] == 1
    assert not run.failure_file.exists()  # the failure of attempt 0 moved to logs/attempt-0/
    assert (run.logs / "attempt-0" / "failure.json").exists()


# --- preemption and resume (a requeue: below, and test_slurm_allocation.py) ------------------------

def test_resume_goes_on_with_the_attempt_number_and_starts_at_zero_restarts(fake_launcher, tmp_path):
    """`jaxlaunch run --resume`: attempt 1, restarts 0 (a resume is not one of max_restarts)."""
    spec, run = make_run(tmp_path, max_restarts=2)
    first = supervisor(fake_launcher, spec, run, "stop").supervise()
    assert (first.state, first.exit_code) == ("PREEMPTED", 75)
    assert status(run)["state"] == "PREEMPTED" and status(run)["attempts"] == 1

    resumed = supervisor(fake_launcher, spec, run, "complete", resume=True).supervise()
    assert (resumed.state, resumed.exit_code) == ("COMPLETED", 0)
    assert seen(run, 1)["attempt"] == 1
    assert seen(run, 1)["status"]["attempts"] == 2 and seen(run, 1)["status"]["restarts"] == 0
    assert status(run)["attempts"] == 2 and status(run)["restarts"] == 0
    assert json.loads(run.result_file.read_text()) == {"attempt": 1}
    assert (run.logs / "attempt-0" / "launcher.log").exists()  # the preempted attempt's logs kept
    assert [e["attempt"] for e in run.read_events() if e["event"] == "resumed"] == [1]


def test_resume_keeps_its_own_max_restarts_budget(fake_launcher, tmp_path):
    """A resumed run that fails restarts max_restarts times more, counted from the resume."""
    spec, run = make_run(tmp_path, max_restarts=1)
    supervisor(fake_launcher, spec, run, "stop").supervise()
    outcome = supervisor(fake_launcher, spec, run, "fail", resume=True).supervise()
    assert (outcome.state, outcome.attempts) == ("FAILED", 3)  # attempts 1 and 2 ran in this resume
    assert status(run)["attempts"] == 3 and status(run)["restarts"] == 1
    assert seen(run, 2)["attempt"] == 2


def test_a_notice_to_the_supervisor_reaches_the_ranks_and_ends_the_run_preempted(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    sup = supervisor(fake_launcher, spec, run, "wait_for_notice")
    received = []
    guard = signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    try:
        threading.Timer(0.3, lambda: signal.raise_signal(signal.SIGUSR2)).start()
        outcome = sup.supervise()
    finally:
        signal.signal(signal.SIGUSR2, guard)
    assert received == []  # the supervisor's own handler took it
    assert (outcome.state, outcome.exit_code) == ("PREEMPTED", 75)
    assert sorted(p.name for p in run.path.glob("notice-*.json")) == ["notice-0.json", "notice-1.json"]
    stopped = next(e for e in run.read_events() if e["event"] == "stopped")
    assert stopped["sources"] == ["supervisor"] and stopped["at_agreed_point"] is True
    assert not run.failure_file.exists()
    assert status(run)["state"] == "PREEMPTED" and status(run)["exit_code"] == 75


# --- what the supervisor asks its Allocation (a scripted one: tests/fake_allocation.py) -------------

def test_the_supervisor_binds_its_allocation_to_the_job_once_and_asks_no_more_of_it(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation()
    sup = supervisor(fake_launcher, spec, run, "complete", allocation=allocation)
    assert allocation.bound == [(spec, run, sup.echo)]
    assert sup.supervise().state == "COMPLETED"
    assert len(allocation.bound) == 1
    assert allocation.questions() == ["failing_nodes", "launch_command", "finish"]
    assert allocation.asked("finish") == [(JobState.COMPLETED, None)]


def test_the_attempt_runs_the_allocations_launch_command_and_logs_it(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(launch=lambda argv: [*argv[:-1], "complete"])  # the ranks behave otherwise
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=allocation).supervise()
    assert outcome.state == "COMPLETED"
    assert allocation.asked("launch_command") == [([sys.executable, str(fake_launcher), "fail"],)]
    assert [e["argv"] for e in run.read_events() if e["event"] == "launch"] == [
        [sys.executable, str(fake_launcher), "complete"]]


def test_a_node_lost_under_a_failed_attempt_is_left_behind_through_the_allocation(fake_launcher, tmp_path):
    """The attempt failed and the allocation says a node went away under it: the supervisor does not
    restart on a smaller allocation, but asks the allocation's one decision (no spare: a requeue
    without that node) and tells it the cause at the end. Slurm's side (the node excluded, counted,
    logged): test_slurm_allocation.py, test_a_lost_node_is_left_behind_by_a_requeue_that_excludes_it."""
    spec, run = make_run(tmp_path, max_restarts=2)
    allocation = ScriptedAllocation(lost=[{"node3": "DOWN (Not responding)"}], requeues=1)
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("REQUEUED", 0, 1)
    assert not (run.path / "seen-attempt-1.json").exists()  # no restart
    assert allocation.asked("replace_nodes") == [({"node3": "DOWN (Not responding)"}, "node_failure", 0)]
    # spares first, then the requeue: the order is the Allocation's (replace_nodes)
    assert [call[0] for call in allocation.calls if call[0] in ("swap_in_spares", "leave_nodes_behind")] == [
        "swap_in_spares", "leave_nodes_behind"]
    assert allocation.asked("finish") == [(JobState.REQUEUED, "node_failure")]
    assert not run.failure_file.exists() and status(run)["state"] == "REQUEUED"


def test_a_spare_in_a_lost_nodes_place_starts_the_next_attempt_at_once_and_is_no_restart(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)  # max_restarts=0: a swap is not a restart
    allocation = ScriptedAllocation(lost=[{"node2": "State=DOWN"}], spares=1, requeues=1)
    outcome = supervisor(fake_launcher, spec, run, "fail_first", allocation=allocation).supervise()
    assert (outcome.state, outcome.attempts, outcome.restarts) == ("COMPLETED", 2, 0)
    assert seen(run, 1)["attempt"] == 1 and seen(run, 1)["status"]["restarts"] == 0
    assert status(run)["restarts"] == 0
    assert (run.logs / "attempt-0" / "failure.json").exists()  # the failed attempt's record, kept with its logs
    assert allocation.asked("leave_nodes_behind") == [] and allocation.requeues == 1
    assert allocation.asked("finish") == [(JobState.COMPLETED, None)]


def test_with_no_spare_and_no_requeue_left_the_job_ends_with_the_allocations_failure(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path, max_restarts=2)
    allocation = ScriptedAllocation(lost=[{"node2": "State=DOWN"}])
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts) == ("FAILED", 1, 1)
    failure = json.loads(run.failure_file.read_text())  # the supervisor writes the allocation's failure
    assert (failure["summary"], failure["reason"]) == ("node(s) node2 and no requeue left", "node_failure")
    assert status(run)["reason"] == failure["summary"]
    assert allocation.asked("finish") == [(JobState.FAILED, None)]  # no requeue to make


@pytest.mark.parametrize("spares, requeues, state, attempts", [(1, 0, "COMPLETED", 1), (0, 1, "REQUEUED", 0),
                                                                (0, 0, "FAILED", 0)],
                         ids=["spare", "requeue", "end"])
def test_a_node_failing_the_health_check_gets_the_allocations_decision_before_any_attempt(
        fake_launcher, tmp_path, spares, requeues, state, attempts):
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(failing={"node1": "health check exited with code 1"}, spares=spares,
                                    requeues=requeues)
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=allocation).supervise()
    assert (outcome.state, outcome.attempts) == (state, attempts)
    assert allocation.asked("replace_nodes") == [({"node1": "health check exited with code 1"}, "health_check", 0)]
    assert (run.path / "seen-attempt-0.json").exists() == (state == "COMPLETED")  # no attempt ran on a bad node
    assert allocation.asked("finish") == [(JobState.parse(state), "health_check" if state == "REQUEUED" else None)]
    if state == "FAILED":
        assert json.loads(run.failure_file.read_text())["reason"] == "health_check"


def test_a_hangs_culprit_nodes_are_blamed_only_where_the_allocation_can_replace_them(tmp_path):
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(spares=1)
    sup = Supervisor(spec, run, [], {}, allocation=allocation)
    sup.channel = SimpleNamespace(started=lambda: [{"host": "n1"}, {"host": "n2"}])
    failure = {"hang": {"roll_call": {"culprits": [{"rank": 1, "host": "n2", "why": "in its own code at l.py:2"}]}}}
    assert list(sup._hang_culprit_nodes("hang", failure)) == ["n2"]
    assert allocation.asked("can_replace_nodes") == [({"n2"},)]
    allocation.spares = 0
    assert sup._hang_culprit_nodes("hang", failure) == {}
    allocation.requeues = 1
    assert list(sup._hang_culprit_nodes("collective_timeout", failure)) == ["n2"]


@pytest.mark.parametrize("notice", [(JobState.REQUEUED, None, "preemption"),
                                    (JobState.FAILED, {"summary": "requeues spent", "reason": "requeue_limit"}, None)],
                         ids=["requeue", "end"])
def test_what_a_notice_leads_to_is_the_allocations_to_say(fake_launcher, tmp_path, notice):
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(notice=notice)
    outcome = supervisor(fake_launcher, spec, run, "stop", allocation=allocation).supervise()
    state, failure, cause = notice
    assert (outcome.state, outcome.exit_code, outcome.failure) == (state, exit_code_for(state), failure)
    assert allocation.asked("after_notice") == [({"supervisor"}, True)]  # every rank stopped at a checkpoint
    assert allocation.asked("finish") == [(state, cause)]
    assert status(run)["state"] == state and status(run).get("reason") == (failure or {}).get("summary")


def test_a_resumed_job_the_allocation_says_was_requeued_too_often_ends_before_starting(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    run.update_status(state="REQUEUED", attempts=2)
    spent = {"summary": "requeued 3 times, more than the spec allows", "reason": "requeue_limit", "state": "FAILED"}
    allocation = ScriptedAllocation(requeues_spent=spent)
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=allocation, resume=True).supervise()
    assert (outcome.state, outcome.exit_code, outcome.attempts, outcome.failure) == ("FAILED", 1, 2, spent)
    assert allocation.questions() == ["requeues_spent"] and allocation.asked("requeues_spent") == [(2,)]
    assert not (run.path / "seen-attempt-2.json").exists()  # nothing started


def test_a_resumed_job_logs_the_schedulers_restart_count(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    run.update_status(state="REQUEUED", attempts=2)
    allocation = ScriptedAllocation(restart_count="2")
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=allocation, resume=True).supervise()
    assert (outcome.state, outcome.attempts) == ("COMPLETED", 3) and seen(run, 2)["attempt"] == 2
    assert [(e["attempt"], e["restart_count"]) for e in run.read_events() if e["event"] == "resumed"] == [(2, "2")]


def test_a_failed_attempt_the_scheduler_preempted_is_a_preemption_but_a_timeout_is_not(fake_launcher, tmp_path):
    preempted = dict(ended_by_preemption=True, notice=(JobState.REQUEUED, None, "preemption"))
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(**preempted)
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0)
    assert allocation.asked("after_notice") == [(set(), False)]  # no notice reached the ranks, no checkpoint
    assert not run.failure_file.exists()

    spec, run = make_run(tmp_path / "timeout", timeout=1)
    allocation = ScriptedAllocation(**preempted)
    outcome = supervisor(fake_launcher, spec, run, "hang", allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code) == ("TIMEOUT", 124)
    assert allocation.asked("ended_by_preemption") == [] and allocation.asked("after_notice") == []

    spec, run = make_run(tmp_path / "local")
    allocation = ScriptedAllocation(job_id=None, **preempted)  # no scheduler: nobody to preempt it
    assert supervisor(fake_launcher, spec, run, "fail", allocation=allocation).supervise().state == "FAILED"
    assert allocation.asked("ended_by_preemption") == []


@pytest.mark.parametrize("mode", ["scancelled", "sigterm_stop"])
def test_a_cancel_the_scheduler_saw_ends_the_job_cancelled_and_any_other_sigterm_is_a_notice(fake_launcher, tmp_path,
                                                                                           mode):
    """Slurm sends a cancel and a preemption the same SIGTERM: the allocation tells them apart."""
    requeue = (JobState.REQUEUED, None, "preemption")
    spec, run = make_run(tmp_path)
    allocation = ScriptedAllocation(cancelled_outside=True, notice=requeue)
    outcome = supervisor(fake_launcher, spec, run, mode, allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code) == ("CANCELLED", 143)
    assert allocation.asked("after_notice") == [] and allocation.asked("finish") == [(JobState.CANCELLED, None)]

    spec, run = make_run(tmp_path / "preempted")
    allocation = ScriptedAllocation(notice=requeue)
    outcome = supervisor(fake_launcher, spec, run, mode, allocation=allocation).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0)
    assert allocation.asked("after_notice") == [({"SIGTERM"}, mode == "sigterm_stop")]
    assert allocation.asked("finish") == [(JobState.REQUEUED, "preemption")]


def test_jaxlaunch_cancel_is_a_cancel_whatever_the_allocation_says(fake_launcher, tmp_path):
    """`jaxlaunch cancel` writes its event before it signals: no requeue, whatever the allocation
    would make of the notice. An event from before this launch does not count."""
    requeue = (JobState.REQUEUED, None, "preemption")
    spec, run = make_run(tmp_path)
    run.log_event("cancel_requested", by="an earlier batch job")
    time.sleep(0.01)
    allocation = ScriptedAllocation(notice=requeue)
    assert supervisor(fake_launcher, spec, run, "sigterm_stop", allocation=allocation).supervise().state == "REQUEUED"

    spec, run = make_run(tmp_path / "now")
    allocation = ScriptedAllocation(notice=requeue)
    sup = supervisor(fake_launcher, spec, run, "scancelled", allocation=allocation)
    run.log_event("cancel_requested", by="jaxlaunch cancel")
    assert sup.supervise().state == "CANCELLED"
    assert allocation.asked("after_notice") == [] and allocation.asked("finish") == [(JobState.CANCELLED, None)]


# --- what is printed at the end -------------------------------------------------------------------

def test_describe_outcome_counts_restarts_and_says_how_to_resume(tmp_path):
    spec, run = make_run(tmp_path)
    assert describe_outcome(spec, run, Outcome("COMPLETED", 0, None, 1), 2.0) == [
        "jaxlaunch: job units COMPLETED in 2.0 s; every rank exited 0 (the program set no result)"]
    run.result_file.write_text("1")
    assert describe_outcome(spec, run, Outcome("COMPLETED", 0, None, 1), 2.0) == [
        f"jaxlaunch: job units COMPLETED in 2.0 s; result: {run.result_file}"]
    assert describe_outcome(spec, run, Outcome("COMPLETED", 0, None, 3), 2.0)[0].endswith(
        f"COMPLETED in 2.0 s after 2 restart(s); result: {run.result_file}")
    assert describe_outcome(spec, run, Outcome("PREEMPTED", 75, None, 1), 2.0)[1] == (
        f"  continue it with: jaxlaunch run --resume {run.path}")


def test_a_resumed_run_that_completes_at_once_reports_no_restart(fake_launcher, tmp_path):
    spec, run = make_run(tmp_path)
    supervisor(fake_launcher, spec, run, "stop").supervise()
    outcome = supervisor(fake_launcher, spec, run, "complete", resume=True).supervise()
    assert status(run)["restarts"] == 0
    assert "restart" not in describe_outcome(spec, run, outcome, 1.0)[0]


# --- the rank side: early exits, the watchdog, notices --------------------------------------------

class FakeTracker:
    """What the monitor asks a CollectiveTracker: the oldest collective still waiting."""

    blocking = blocking_timeout = None  # no blocking MPI call with a timeout of its own

    def __init__(self, waiting=None, count=2):
        self.waiting, self.count = waiting, count

    def oldest_waiting(self):
        return self.waiting

    def completed(self):
        return self.count if self.waiting is None else self.waiting[0] - 1


@pytest.fixture
def fresh_notice(monkeypatch):
    notice = preemption.StopNotice()
    monkeypatch.setattr(preemption, "NOTICE", notice)
    return notice


class FakeClient:
    """A rank's connection to the supervisor: what the monitor sent, and messages to give it."""

    def __init__(self):
        self.sent, self.inbox, self.lost = [], [], None

    def send(self, kind, record):
        self.sent.append((kind, dataclasses.asdict(record) if dataclasses.is_dataclass(record) else record))
        return True

    def receive(self, timeout):
        messages, self.inbox = self.inbox, []
        return messages

    def close(self):
        pass


def rank_monitor(tmp_path, waiting, collective_timeout):
    """Rank 0's monitor of a 3-rank job while it waits in `waiting` (seq, name, seconds)."""
    run = RunDirectory(tmp_path / "run")
    run.logs.mkdir(parents=True)
    return monitor.RankMonitor(run, 0, 3, collective_timeout, tracker=FakeTracker(waiting), client=FakeClient())


def sent(mon, kind):
    return [record for k, record in mon.client.sent if k == kind]


def waiting_record(rank, seq, name="allreduce", seconds=1.5):
    return {"rank": rank, "seq": seq, "name": name, "since": time.time() - seconds}


def done_record(rank, collectives, at=None):
    return {"rank": rank, "collectives": collectives, "time": at or time.time(), "stopped": None}


def test_a_peer_that_left_main_is_the_cause():
    request = supervisor_channel.left_early([waiting_record(0, 2)], [done_record(1, 1), done_record(2, 5)])
    assert request is not None and request.reason == "left_early" and request.culprit == 1 and request.rank == 0
    assert request.message == "rank 1 left main after 1 collectives, while rank 0 waits in allreduce #2"
    assert request.collective["seq"] == 2 and 1.4 < request.collective["seconds"] < 3


def test_no_peer_is_blamed_that_joined_the_collective_or_when_no_one_waits():
    assert supervisor_channel.left_early([waiting_record(0, 2)], [done_record(1, 2), done_record(2, 5)]) is None
    assert supervisor_channel.left_early([], [done_record(1, 1)]) is None
    assert supervisor_channel.left_early([waiting_record(0, 2)], []) is None


def test_a_peer_that_left_main_is_the_cause_even_past_collective_timeout(tmp_path):
    """Rank 0's watchdog asked for a stop (collective_timeout), but rank 1 left main before that
    collective: the supervisor names rank 1."""
    spec, run = make_run(tmp_path, collective_timeout=1)
    sup = Supervisor(spec, run, [], {})
    sup.channel = supervisor_channel.ControlServer(run)  # an attempt's channel (not started: no socket)
    sup.channel._records["abort"][0] = {"rank": 0, "reason": "collective_timeout", "time": time.time(),
                                        "message": "allreduce #2 on rank 0 waited 2 s, past collective_timeout=1 s"}
    sup.channel._records["waiting"][0] = waiting_record(0, 2)
    sup.channel._records["done"][1] = done_record(1, 1)
    reason, message = sup._why_stop()
    assert reason == "left_early" and message.startswith("rank 1 left main after 1 collectives")
    assert sup.channel.abort_requests()[0]["culprit"] == 1


def test_a_wait_is_reported_once_after_the_grace(tmp_path, fresh_notice):
    mon = rank_monitor(tmp_path / "grace", (2, "allreduce", monitor.EARLY_EXIT_GRACE_SECONDS / 2), 30)
    mon.check()
    assert sent(mon, "waiting") == []
    mon.tracker.waiting = (2, "allreduce", monitor.EARLY_EXIT_GRACE_SECONDS + 0.5)
    mon.check()
    mon.check()
    [report] = sent(mon, "waiting")
    assert report["seq"] == 2 and report["name"] == "allreduce" and report["rank"] == 0
    mon.tracker.waiting = (3, "allreduce", monitor.EARLY_EXIT_GRACE_SECONDS + 0.5)
    mon.check()
    assert [r["seq"] for r in sent(mon, "waiting")] == [2, 3]


def test_the_collective_watchdog_fires_past_collective_timeout_only(tmp_path, fresh_notice):
    mon = rank_monitor(tmp_path / "before", (4, "broadcast", 29.5), 30)
    mon.check()
    assert sent(mon, "abort") == []
    mon = rank_monitor(tmp_path / "after", (4, "broadcast", 31.0), 30)
    mon.check()
    [request] = sent(mon, "abort")
    assert request["reason"] == "collective_timeout" and request["culprit"] is None
    assert request["message"] == "broadcast #4 on rank 0 waited 31 s, past collective_timeout=30 s"
    assert [r["seq"] for r in sent(mon, "waiting")] == [4]  # first, so the supervisor can blame a peer
    mon.check()  # asks once
    assert len(sent(mon, "abort")) == 1


def test_the_monitor_passes_the_supervisors_notice_on_once(tmp_path, fresh_notice):
    mon = rank_monitor(tmp_path, None, None)
    mon.check()
    assert fresh_notice.sources == 0 and sent(mon, "notice") == []
    mon.on_message({"kind": "preempt", "signal": "SIGUSR2", "time": 1.0})
    mon.check()
    assert fresh_notice.names(fresh_notice.sources) == ["supervisor"]
    [record] = sent(mon, "notice")
    assert record["rank"] == 0 and record["sources"] == ["supervisor"]
    assert not any(e["event"] == "notice" for e in mon.run.read_events())  # the supervisor logs its own
    mon.on_message({"kind": "preempt", "signal": "SIGUSR2", "time": 2.0})
    mon.check()
    assert fresh_notice.sources == preemption.SOURCES["supervisor"] and len(sent(mon, "notice")) == 1


def test_a_notice_a_rank_got_itself_is_reported_with_its_sources(tmp_path, fresh_notice):
    mon = rank_monitor(tmp_path, None, None)
    fresh_notice.set("SIGUSR2")
    mon.check()
    assert [r["sources"] for r in sent(mon, "notice")] == [["SIGUSR2"]]
    assert [e["source"] for e in mon.run.read_events() if e["event"] == "notice"] == ["SIGUSR2"]


def test_a_rank_that_lost_its_supervisor_stops_at_should_stop_then_exits(tmp_path, fresh_notice, monkeypatch):
    mon = rank_monitor(tmp_path, None, None)
    mon._dump_fd = os.open(mon.run.rank_log(0), os.O_WRONLY | os.O_CREAT)
    exits = []
    monkeypatch.setattr(monitor.os, "_exit", exits.append)
    clock = [100.0]
    monkeypatch.setattr(monitor.time, "monotonic", lambda: clock[0])
    try:
        mon.client.lost = "the supervisor closed the connection"
        mon.on_lost()
        assert fresh_notice.names(fresh_notice.sources) == ["supervisor"] and exits == []
        clock[0] += monitor.ORPHAN_EXIT_SECONDS - 1
        mon.on_lost()
        assert exits == []
        clock[0] += 2
        mon.on_lost()
        assert exits == [monitor.EXIT_ORPHANED]
    finally:
        os.close(mon._dump_fd)
    log = mon.run.rank_log(0).read_text()
    assert "rank 0 lost its supervisor (the supervisor closed the connection)" in log
    assert "jaxlaunch: stacks of rank 0 (supervisor_lost)" in log


def test_a_notice_keeps_the_time_of_the_first_and_every_source(monkeypatch, fresh_notice):
    clock = iter([10.0, 20.0, 30.0])
    monkeypatch.setattr(preemption.time, "time", lambda: next(clock))
    fresh_notice.set("SIGTERM")
    fresh_notice.set("supervisor")
    assert fresh_notice.received == 10.0
    assert fresh_notice.names(fresh_notice.sources) == ["SIGTERM", "supervisor"]


def test_the_first_sigterm_is_a_notice_and_a_second_one_ends_the_rank(monkeypatch, fresh_notice):
    calls = []
    monkeypatch.setattr(preemption, "os", SimpleNamespace(getpid=lambda: 1234,
                                                           kill=lambda pid, sig: calls.append(("kill", pid, sig))))
    monkeypatch.setattr(preemption, "signal", SimpleNamespace(
        SIGTERM=signal.SIGTERM, SIG_DFL=signal.SIG_DFL,
        signal=lambda sig, handler: calls.append(("handler", sig, handler))))
    preemption._on_term(signal.SIGTERM, None)
    assert calls == [] and fresh_notice.names(fresh_notice.sources) == ["SIGTERM"]
    preemption._on_term(signal.SIGTERM, None)
    assert calls == [("handler", signal.SIGTERM, signal.SIG_DFL), ("kill", 1234, signal.SIGTERM)]


def test_a_sigterm_while_the_supervisor_stops_the_job_ends_the_rank_at_once(monkeypatch, fresh_notice):
    calls = []
    monkeypatch.setattr(preemption, "os", SimpleNamespace(getpid=lambda: 1234,
                                                           kill=lambda pid, sig: calls.append((pid, sig))))
    monkeypatch.setattr(preemption, "signal", SimpleNamespace(SIGTERM=signal.SIGTERM, SIG_DFL=signal.SIG_DFL,
                                                               signal=lambda sig, handler: None))
    fresh_notice.stopping = True
    preemption._on_term(signal.SIGTERM, None)
    assert calls == [(1234, signal.SIGTERM)] and fresh_notice.sources == 0


def test_a_stop_request_makes_every_rank_answer_and_turns_sigterm_back_into_a_kill(tmp_path, fresh_notice):
    mon = rank_monitor(tmp_path, (2, "allreduce", 4.0), None)
    mon._dump_fd = os.open(mon.run.rank_log(0), os.O_WRONLY | os.O_CREAT)
    try:
        mon.on_message({"kind": "stop", "reason": "timeout", "time": 1.0})
        mon.on_message({"kind": "stop", "reason": "timeout", "time": 1.0})  # answered once
    finally:
        os.close(mon._dump_fd)
    assert fresh_notice.stopping
    [state] = sent(mon, "state")
    assert state["rank"] == 0 and state["reason"] == "timeout"
    assert state["waiting_in"] == {"seq": 2, "name": "allreduce", "seconds": 4.0}
    assert "jaxlaunch: stacks of rank 0 (timeout)" in mon.run.rank_log(0).read_text()


def test_root_cause_of_a_left_early_stop_is_the_culprit_unless_it_recorded_its_own_error():
    request = {"rank": 0, "reason": "left_early", "culprit": 1, "time": 5.0,
               "message": "rank 1 left main after 1 collectives, while rank 0 waits in allreduce #2"}
    args = dict(state="FAILED", reason="left_early", num_processes=2, launcher_reports=[], reports_every_task=False,
                finished_ranks={1}, started_ranks={0: "a", 1: "b"}, rank_states=[], log_tail=lambda rank: "",
                launcher_exit_code=None, attempt=0, seen_at=9.0)
    failure = root_cause.build_failure(rank_errors=[], abort_requests=[request], **args)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["exit_code"] == 0
    assert failure["first_failure"]["error"] == f"left main early: {request['message']}"
    assert failure["torn_down_ranks"] == [0]
    own = {"rank": 1, "host": "b", "time": 4.0, "error": "RuntimeError: own", "exit_code": 1, "signal": None}
    failure = root_cause.build_failure(rank_errors=[own], abort_requests=[request], **args)
    assert failure["first_failure"]["error"] == "RuntimeError: own" and failure["first_failure"]["source"] == "rank"


@pytest.mark.parametrize("program", ["launcher.backends.slurm.batch", "launcher.supervisor"])
def test_the_batch_program_supervises_and_so_does_the_line_of_older_scripts(fake_launcher, tmp_path, program):
    """A batch script runs `python -m launcher.backends.slurm.batch RUN_DIR -- LAUNCH...`; scripts
    rendered before it existed run `python -m launcher.supervisor ...`, which Slurm keeps for a
    queued or requeued job across an upgrade: both supervise the job to its end."""
    import subprocess

    spec, run = make_run(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({RUN_DIR_ENV: str(run.path), "FAKE_RANKS": str(spec.num_processes)})
    done = subprocess.run([sys.executable, "-m", program, str(run.path), "--", sys.executable, str(fake_launcher),
                           "complete"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert status(run)["state"] == "COMPLETED" and "COMPLETED" in done.stderr
