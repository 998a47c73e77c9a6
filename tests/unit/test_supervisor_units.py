"""The supervisor's decisions, fast: a small Python script stands in for mpirun and its ranks (it
speaks the control protocol as real ranks do, and writes their error records and result.json), so each test runs
the real Supervisor loop in well under a second, without MPI or JAX. Also the requeue decisions
(requeue.py) with a made-up `scontrol show job` record, and the rank side of notices and early
exits (monitor.py, preemption.py) with a made-up collective tracker."""

import dataclasses
import importlib
import json
import os
import signal
import sys
import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from launcher.supervisor import channel as supervisor_channel
from launcher.rundir import RunDirectory
from launcher.rank import monitor, preemption
from launcher.environment import RUN_DIR_ENV
from launcher.spec import JobSpec
from launcher.spec.model import SlurmSpec
from launcher.backends.slurm import fit, nodes, requeue
from launcher.errors import SchedulerError
from launcher.backends.slurm.allocation import SlurmAllocation
from launcher.supervisor import root_cause
from launcher.supervisor.supervise import Outcome, Supervisor, describe_outcome, exit_code_for

supervise = importlib.import_module("launcher.supervisor.supervise")  # the package exports a function by that name
attempt = importlib.import_module("launcher.supervisor.attempt")  # one attempt: where its timings are read

# Stands in for `mpirun ... bootstrap`: argv[1] says how the "ranks" behave this attempt. Each
# fake rank speaks the real control protocol (launcher/channel.py) to the supervisor.
FAKE_LAUNCHER = r'''
import json, os, signal, sys, time
from pathlib import Path

from launcher.rank.channel import ControlClient

run = Path(os.environ["JAXLAUNCH_RUN_DIR"])
ranks = int(os.environ["FAKE_RANKS"])
attempt = int(os.environ["JAXLAUNCH_ATTEMPT"])
mode = sys.argv[1]
if mode == "fail_first":
    mode = "fail" if attempt == 0 else "complete"
clients = {rank: ControlClient.from_env(rank) for rank in range(ranks)}


def write(path, value):
    tmp = path.parent / ("." + path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


# What the supervisor told this attempt: its attempt number and status.json while it runs.
write(run / f"seen-attempt-{attempt}.json",
      {"attempt": attempt, "status": json.loads((run / "status.json").read_text())})
print(f"fake launcher: attempt {attempt}, {mode}", flush=True)


def done(rank, collectives=3, stopped=None):
    clients[rank].send("done", {"collectives": collectives, "time": time.time(), "stopped": stopped})
    clients[rank].close()


if mode == "complete":
    for rank in range(ranks):
        done(rank)
    write(run / "result.json", {"attempt": attempt})
elif mode == "stop":  # every rank stopped at the agreed should_stop() and checkpointed
    for rank in range(ranks):
        done(rank, stopped={"sources": ["supervisor"], "call": 4, "time": time.time()})
elif mode == "wait_for_notice":  # checkpoint and stop once the supervisor passes a notice on
    deadline = time.monotonic() + 20
    for rank in range(ranks):
        while not any(m["kind"] == "preempt" for m in clients[rank].receive(0.05)):
            if time.monotonic() > deadline:
                sys.exit("no notice came within 20 s")
        write(run / f"notice-{rank}.json", {"rank": rank})
    for rank in range(ranks):
        done(rank, stopped={"sources": ["supervisor"], "call": 4, "time": time.time()})
elif mode == "half_stopped":  # rank 0 stopped at a should_stop(), rank 1 returned as if done
    done(0, stopped={"sources": ["SIGUSR2"], "call": 4, "time": time.time()})
    done(1)
elif mode == "one_vanished":  # rank 0 finished and wrote the result; rank 1 started, never finished
    for rank in range(ranks):
        clients[rank].send("started", {"host": f"node{rank + 1}", "pid": os.getpid(), "time": time.time()})
    done(0)
    write(run / "result.json", {"attempt": attempt})
elif mode == "fail":
    write(run / "logs" / "rank-1.error.json",
          {"rank": 1, "host": "node2", "time": time.time(), "exit_code": 1, "signal": None,
           "error": f"RuntimeError: attempt {attempt} fails", "traceback": "Traceback ..."})
    sys.exit(1)
elif mode == "left_early":  # rank 1 left main after 1 collective; rank 0 waits in #2
    done(1, collectives=1)
    clients[0].send("waiting", {"seq": 2, "name": "allreduce", "since": time.time() - 1})
    time.sleep(60)
elif mode == "collective_timeout":  # rank 0's watchdog asks for the stop
    clients[0].send("waiting", {"seq": 2, "name": "allreduce", "since": time.time() - 4})
    clients[0].send("abort", {"host": "node1", "reason": mode, "time": time.time(),
                              "message": "allreduce #2 on rank 0 waited 4 s, past collective_timeout=3 s",
                              "collective": {"seq": 2, "name": "allreduce", "seconds": 4.0}, "culprit": None})
    time.sleep(60)
elif mode == "cancel_me":  # as scancel does: SIGTERM to the supervisor
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(60)
elif mode in ("scancelled", "sigterm_stop"):  # Slurm's SIGTERM (a cancel or a preemption) reached the ranks
    for rank in range(ranks):
        clients[rank].send("notice", {"rank": rank, "sources": ["SIGTERM"], "time": time.time()})
    if mode == "sigterm_stop":  # srun mode: they agreed on a step, checkpointed and returned
        for rank in range(ranks):
            done(rank, stopped={"sources": ["SIGTERM"], "call": 4, "time": time.time()})
    else:  # mpirun mode: the same signal reached the supervisor, and mpirun ended the ranks
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(60)
elif mode == "hang":
    time.sleep(60)
elif mode == "hang_after_a_rank_died":  # as prterun once did after ranks died in MPI_Init
    print("prterun detected that one or more processes exited with non-zero status,\n"
          "thus causing the job to be terminated. The first process to do so was:\n\n"
          "   Process name: [prterun-vm-22377@1,1]\n   Exit code:    14", flush=True)
    time.sleep(60)
elif mode == "hang_after_mpi_init_failed":  # prterun, under load, after both ranks died in MPI_Init
    print("*** An error occurred in MPI_Init_thread\n*** on a NULL communicator\n"
          "[vm:05560] Local abort before MPI_INIT completed completed successfully, but am not able to "
          "aggregate error messages, and not able to guarantee that all other processes were killed!", flush=True)
    time.sleep(60)
else:
    sys.exit(f"unknown mode {mode}")
'''


@pytest.fixture(scope="module")
def fake_launcher(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake") / "fake_launcher.py"
    path.write_text(FAKE_LAUNCHER)
    return path


@pytest.fixture(autouse=True)
def quick_stops(monkeypatch):
    """The fake ranks never answer a stop request: do not wait the real 3 s for their stacks."""
    monkeypatch.setattr(attempt, "ANSWER_SECONDS", 0.2)


@pytest.fixture
def slurm(monkeypatch):
    """No Slurm here: `scontrol show job` answers `slurm.record`, `scontrol requeue` is recorded; the
    cluster's nodes cannot be read (a test that needs them fakes fit.read_cluster)."""
    state = SimpleNamespace(record={}, requeued=[], cancelled=[])

    def no_cluster():
        raise SchedulerError(["scontrol", "show", "node"], 1, "", "the unit tier asks no Slurm")
    monkeypatch.setattr(fit, "read_cluster", no_cluster)
    monkeypatch.setattr(requeue, "job_record", lambda job_id: dict(state.record))
    monkeypatch.setattr(requeue, "requeue", lambda job_id: state.requeued.append(job_id))
    monkeypatch.setattr(requeue, "cancel_in_slurm", lambda job_id: state.cancelled.append(job_id))
    monkeypatch.delenv(requeue.RESTART_COUNT_ENV, raising=False)
    return state


def make_run(tmp_path, max_requeues=3, **fields) -> tuple[JobSpec, RunDirectory]:
    spec = JobSpec(name="units", entrypoint="job.py:main", processes_per_node=2,
                   slurm=SlurmSpec(max_requeues=max_requeues), **fields)
    return spec, RunDirectory.create(spec, tmp_path / "run")


def supervisor(fake_launcher, spec, run, mode, **kw) -> Supervisor:
    echoed = []
    sup = Supervisor(spec, run, [sys.executable, str(fake_launcher), mode],
                     {RUN_DIR_ENV: str(run.path), "FAKE_RANKS": str(spec.num_processes)},
                     echo=echoed.append, write_output=lambda data: None, **kw)
    sup.echoed = echoed
    return sup


def seen(run, attempt) -> dict:
    """What attempt `attempt` saw: its JAXLAUNCH_ATTEMPT and status.json while it ran."""
    return json.loads((run.path / f"seen-attempt-{attempt}.json").read_text())


def status(run) -> dict:
    return run.read_status()


def end_time(seconds_from_now: float) -> str:
    """An EndTime as `scontrol show job` prints it (local time)."""
    return datetime.fromtimestamp(time.time() + seconds_from_now).strftime("%Y-%m-%dT%H:%M:%S")


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


# --- preemption, resume and requeue ---------------------------------------------------------------

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


def test_a_preempted_batch_job_requeues_itself_and_the_requeued_job_starts_at_zero_restarts(
        fake_launcher, tmp_path, slurm, monkeypatch):
    spec, run = make_run(tmp_path, max_requeues=2, max_restarts=2)
    first = supervisor(fake_launcher, spec, run, "stop", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (first.state, first.exit_code) == ("REQUEUED", 0)
    assert slurm.requeued == ["7"]
    after = status(run)
    assert (after["state"], after["requeues"], after["preemptions"], after["timeouts"]) == ("REQUEUED", 1, 1, 0)

    # Slurm runs the batch script again, same job id, SLURM_RESTART_COUNT=1
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, "1")
    second = supervisor(fake_launcher, spec, run, "complete", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (second.state, second.exit_code) == ("COMPLETED", 0)
    assert seen(run, 1)["attempt"] == 1
    assert seen(run, 1)["status"]["attempts"] == 2 and seen(run, 1)["status"]["restarts"] == 0
    final = status(run)
    assert (final["attempts"], final["restarts"], final["requeues"], final["preemptions"]) == (2, 0, 1, 1)
    assert slurm.requeued == ["7"]  # not requeued again
    assert not any(e["event"] == "requeued_by_slurm" for e in run.read_events())


@pytest.mark.parametrize("requeues, max_requeues", [(0, 0), (1, 1), (3, 3)])
def test_a_notice_once_max_requeues_are_spent_ends_the_job_failed(fake_launcher, tmp_path, slurm, monkeypatch,
                                                                    requeues, max_requeues):
    spec, run = make_run(tmp_path, max_requeues=max_requeues)
    run.update_status(state="REQUEUED", attempts=requeues, requeues=requeues, preemptions=requeues)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, str(requeues))
    outcome = supervisor(fake_launcher, spec, run, "stop", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    assert slurm.requeued == []
    failure = json.loads(run.failure_file.read_text())
    assert failure["reason"] == "requeue_limit" and failure["state"] == "FAILED"
    assert f"slurm.max_requeues={max_requeues} is spent; no checkpoint was written" in failure["summary"]
    assert failure["summary"].startswith(f"preemption notice after {requeues} requeue(s)")
    final = status(run)
    assert (final["state"], final["exit_code"], final["requeues"]) == ("FAILED", 1, requeues)


@pytest.mark.parametrize("requeues, max_requeues", [(0, 1), (2, 3)])
def test_a_notice_before_max_requeues_are_spent_requeues(fake_launcher, tmp_path, slurm, monkeypatch,
                                                         requeues, max_requeues):
    spec, run = make_run(tmp_path, max_requeues=max_requeues)
    run.update_status(state="REQUEUED", attempts=requeues, requeues=requeues, preemptions=requeues)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, str(requeues))
    outcome = supervisor(fake_launcher, spec, run, "stop", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0)
    assert slurm.requeued == ["7"]
    assert status(run)["requeues"] == requeues + 1 and status(run)["preemptions"] == requeues + 1


def test_a_requeued_job_runs_its_last_allowed_allocation(fake_launcher, tmp_path, slurm, monkeypatch):
    """requeues == max_requeues at the start: this allocation may still run (and finish)."""
    spec, run = make_run(tmp_path, max_requeues=2)
    run.update_status(state="REQUEUED", attempts=2, requeues=2, preemptions=2)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, "2")
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("COMPLETED", 0)
    assert seen(run, 2)["attempt"] == 2


def test_requeues_slurm_made_without_us_count_and_can_spend_the_limit(fake_launcher, tmp_path, slurm,
                                                                       monkeypatch):
    """Slurm requeued the job after a preemption killed it before it could stop: SLURM_RESTART_COUNT
    is ahead of status.json's requeues."""
    spec, run = make_run(tmp_path, max_requeues=3)
    run.update_status(state="RUNNING", attempts=1, requeues=0)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, "2")
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert outcome.state == "COMPLETED"
    assert (status(run)["requeues"], status(run)["preemptions"]) == (2, 2)
    assert [(e["count"], e["restart_count"]) for e in run.read_events() if e["event"] == "requeued_by_slurm"] == [
        (2, 2)]

    spent, run = make_run(tmp_path / "spent", max_requeues=1)
    run.update_status(state="RUNNING", attempts=1, requeues=0)
    outcome = supervisor(fake_launcher, spent, run, "complete", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("FAILED", 1)
    assert json.loads(run.failure_file.read_text())["reason"] == "requeue_limit"
    assert not (run.path / "seen-attempt-1.json").exists()  # ended before starting anything


def test_a_batch_job_ended_by_slurms_preemption_requeues_but_a_timeout_does_not(fake_launcher, tmp_path, slurm):
    slurm.record = {"PreemptTime": "2026-11-22T14:16:48", "EndTime": end_time(3600)}
    spec, run = make_run(tmp_path, max_requeues=2)
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0)
    assert (status(run)["requeues"], status(run)["preemptions"], status(run)["timeouts"]) == (1, 1, 0)
    assert not run.failure_file.exists()

    spec, run = make_run(tmp_path / "timeout", max_requeues=2, timeout=1)
    outcome = supervisor(fake_launcher, spec, run, "hang", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("TIMEOUT", 124)
    assert slurm.requeued == ["7"]  # only the first run's


# `scontrol show job` while a job ends, as read on the local test cluster (Slurm 22.05).
SCANCEL_RECORD = {"JobState": "COMPLETING", "Reason": "None", "PreemptTime": "None", "Restarts": "0"}
TIME_LIMIT_RECORD = {"JobState": "COMPLETING", "Reason": "TimeLimit", "PreemptTime": "None", "Restarts": "0"}
PREEMPTED_RECORD = {"JobState": "RUNNING", "Reason": "None", "PreemptTime": "2026-11-24T23:11:02", "Restarts": "0"}
REQUEUED_RECORD = {"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"}  # no PreemptTime once requeued


@pytest.mark.parametrize("mode", ["scancelled", "sigterm_stop"])
def test_a_plain_scancel_ends_the_batch_job_cancelled_never_requeued(fake_launcher, tmp_path, slurm, mode):
    """Issue 29: the cancel's SIGTERM reached the ranks as a preemption notice and the job requeued."""
    slurm.record = SCANCEL_RECORD
    spec, run = make_run(tmp_path, max_requeues=3)
    outcome = supervisor(fake_launcher, spec, run, mode, allocation=SlurmAllocation("7")).supervise()
    assert (outcome.state, outcome.exit_code) == ("CANCELLED", 143)
    assert slurm.requeued == [] and status(run)["requeues"] == 0 and status(run)["state"] == "CANCELLED"
    assert slurm.cancelled == ["7"]  # Slurm records it CANCELLED, whoever asked


@pytest.mark.parametrize("record", [PREEMPTED_RECORD, REQUEUED_RECORD, TIME_LIMIT_RECORD, {}],
                         ids=["preempt-time-set", "requeued-by-slurm", "time-limit", "no-record"])
@pytest.mark.parametrize("mode", ["scancelled", "sigterm_stop"])
def test_the_same_sigterm_from_a_preemption_still_requeues(fake_launcher, tmp_path, slurm, mode, record):
    slurm.record = record
    spec, run = make_run(tmp_path, max_requeues=3)
    outcome = supervisor(fake_launcher, spec, run, mode, allocation=SlurmAllocation("7")).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0)
    assert slurm.requeued == ["7"] and status(run)["requeues"] == 1 and slurm.cancelled == []


def test_jaxlaunch_cancel_is_a_cancel_whatever_slurm_says(fake_launcher, tmp_path, slurm):
    """`jaxlaunch cancel` writes its event before it signals: no requeue even when scontrol cannot
    answer, or says the job is preempted. An event from before this batch job started does not count."""
    slurm.record = PREEMPTED_RECORD
    spec, run = make_run(tmp_path, max_requeues=3)
    run.log_event("cancel_requested", by="an earlier batch job")
    time.sleep(0.01)
    assert supervisor(fake_launcher, spec, run, "sigterm_stop", allocation=SlurmAllocation("7")).supervise().state == "REQUEUED"

    spec, run = make_run(tmp_path / "now", max_requeues=3)
    sup = supervisor(fake_launcher, spec, run, "scancelled", allocation=SlurmAllocation("7"))
    run.log_event("cancel_requested", by="jaxlaunch cancel")
    assert sup.supervise().state == "CANCELLED" and status(run)["requeues"] == 0


def test_slurms_record_tells_a_cancel_from_a_preemption_and_a_time_limit():
    assert requeue.cancelled_by_slurm(SCANCEL_RECORD)
    assert requeue.cancelled_by_slurm({**SCANCEL_RECORD, "JobState": "CANCELLED"})
    for record in (TIME_LIMIT_RECORD, PREEMPTED_RECORD, REQUEUED_RECORD, {"JobState": "RUNNING", "Reason": "None"},
                   {**SCANCEL_RECORD, "PreemptTime": "2026-11-24T23:11:02"}, {}):
        assert not requeue.cancelled_by_slurm(record), record


@pytest.mark.parametrize("record, sources, cause", [
    ({"PreemptTime": "2026-11-22T14:16:48", "EndTime": end_time(60)}, {"supervisor"}, "preemption"),
    ({"PreemptTime": "None", "EndTime": end_time(3600)}, {"SIGTERM"}, "preemption"),
    ({"PreemptTime": "None", "EndTime": end_time(60)}, {"SIGTERM", "supervisor"}, "preemption"),
    ({"PreemptTime": "None", "EndTime": end_time(100)}, {"supervisor"}, "timeout"),
    ({"PreemptTime": "Unknown", "EndTime": end_time(100)}, {"supervisor"}, "timeout"),
    ({"PreemptTime": "None", "EndTime": end_time(3600)}, {"supervisor"}, "preemption"),
    ({"PreemptTime": "None", "EndTime": end_time(100)}, {"SIGUSR2"}, "preemption"),
    ({"PreemptTime": "None", "EndTime": "Unknown"}, {"supervisor"}, "preemption"),
    ({}, {"supervisor"}, "preemption"),
], ids=["slurm-preempted", "sigterm", "sigterm-near-the-limit", "notice-near-the-limit", "preempt-time-unknown",
        "notice-far-from-the-limit", "usr2-to-the-steps", "no-end-time", "no-record"])
def test_each_notice_is_classified_as_preemption_or_time_limit(record, sources, cause):
    assert requeue.classify(record, sources, notice_seconds=90) == cause


@pytest.mark.parametrize("left, cause", [(149.0, "timeout"), (150.0, "timeout"), (151.0, "preemption")])
def test_a_time_limit_notice_comes_within_checkpoint_notice_plus_60_s(monkeypatch, left, cause):
    monkeypatch.setattr(requeue, "seconds_left", lambda record, now=None: left)
    assert requeue.classify({"EndTime": "x"}, {"supervisor"}, notice_seconds=90) == cause


def test_seconds_left_reads_slurms_end_time():
    now = time.time()
    record = {"EndTime": datetime.fromtimestamp(now + 300).strftime("%Y-%m-%dT%H:%M:%S")}
    assert 298 <= requeue.seconds_left(record, now) <= 300
    assert requeue.seconds_left({"EndTime": "Unknown"}) is None and requeue.seconds_left({}) is None


@pytest.mark.parametrize("record, cause", [
    ({"PreemptTime": "None", "EndTime": end_time(100)}, "timeout"),
    ({"PreemptTime": "2026-11-22T14:16:48", "EndTime": end_time(3600)}, "preemption")])
def test_requeues_count_time_limits_and_preemptions_apart(fake_launcher, tmp_path, slurm, monkeypatch, record,
                                                          cause):
    slurm.record = record
    spec, run = make_run(tmp_path, max_requeues=5)
    run.update_status(state="REQUEUED", attempts=3, requeues=2, preemptions=1, timeouts=1)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, "2")
    sup = supervisor(fake_launcher, spec, run, "stop", allocation=SlurmAllocation("7"), resume=True)
    assert sup.supervise().state == "REQUEUED"
    expected = {"requeues": 3, "preemptions": 1 + (cause == "preemption"), "timeouts": 1 + (cause == "timeout")}
    assert {key: status(run)[key] for key in expected} == expected
    assert next(e for e in run.read_events() if e["event"] == "requeue")["cause"] == cause
    assert any(line.startswith(f"jaxlaunch: {cause} notice (supervisor); requeueing job 7") and
               "(requeue 3 of at most 5)" in line for line in sup.echoed)


def test_the_requeue_limit_summary_counts_each_cause(tmp_path, slurm):
    slurm.record = {"PreemptTime": "None", "EndTime": end_time(100)}
    spec, run = make_run(tmp_path, max_requeues=2)
    run.update_status(attempts=3, requeues=2, preemptions=1, timeouts=1)
    sup = Supervisor(spec, run, [], {}, echo=lambda m: None, allocation=SlurmAllocation("7"))
    sup.notice_time = time.time()  # the notice came to the batch shell (sbatch --signal=B:USR2)
    state, failure = sup.after_preemption(None)
    assert state == "FAILED"
    assert failure["summary"] == (f"timeout notice after 2 requeue(s) (1 preemption(s), 1 time limit(s)): "
                                  f"slurm.max_requeues=2 is spent; no checkpoint was written")
    assert failure["attempt"] == 2
    assert slurm.requeued == []


def test_the_job_id_to_requeue_is_the_array_tasks_own():
    assert requeue.slurm_job_id({"SLURM_JOB_ID": "12"}) == "12"
    assert requeue.slurm_job_id({"SLURM_JOB_ID": "15", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3"}) == "12_3"
    assert requeue.slurm_job_id({}) is None


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



def test_a_second_node_exclusion_keeps_the_nodes_excluded_by_earlier_requeues(fake_launcher, tmp_path, slurm,
                                                                               monkeypatch):
    """Issue 29: the job was requeued once without node1; now node3 fails the health check. The
    requeue must leave both behind (and keep node9, excluded at submission): status.json, the
    event and the one `scontrol update ExcNodeList=...`."""

    spec = JobSpec(name="units", entrypoint="job.py:main", processes_per_node=2,
                   slurm=SlurmSpec(max_requeues=3, health_check="true"))
    run = RunDirectory.create(spec, tmp_path / "run")
    run.update_status(state="REQUEUED", attempts=1, requeues=1, node_failures=1, excluded_nodes=["node1"])
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, "1")
    slurm.record = {"ExcNodeList": "node1,node9"}  # Slurm's record: sbatch --exclude=node9, then our first requeue
    updates = []
    monkeypatch.setattr(nodes, "allocated_nodes", lambda env=os.environ: ["node2", "node3"])
    monkeypatch.setattr(nodes, "health_check", lambda command, allocated: {"node3": "health check exited with code 1"})
    monkeypatch.setattr(nodes, "exclude", lambda job_id, nodelist: updates.append((job_id, nodelist)))
    outcome = supervisor(fake_launcher, spec, run, "complete", allocation=SlurmAllocation("7"), resume=True).supervise()
    assert (outcome.state, outcome.exit_code) == ("REQUEUED", 0) and slurm.requeued == ["7"]
    final = status(run)
    assert final["excluded_nodes"] == ["node1", "node3"]
    assert (final["requeues"], final["node_failures"]) == (2, 2)
    assert next(e for e in run.read_events() if e["event"] == "requeue")["exclude"] == ["node1", "node3"]
    assert len(updates) == 1 and updates[0][0] == "7"
    assert set(updates[0][1].split(",")) == {"node1", "node3", "node9"}, updates


def test_a_node_lost_under_a_failed_attempt_is_left_behind_through_the_allocation(fake_launcher, tmp_path,
                                                                                 monkeypatch, slurm):
    """The attempt failed and the allocation says a node went away under it: the supervisor does not
    restart on a smaller allocation, but requeues without that node (SlurmAllocation.lost_nodes)."""
    spec, run = make_run(tmp_path, max_restarts=2)
    updates = []
    monkeypatch.setattr(nodes, "allocated_nodes", lambda env=os.environ: ["node2", "node3"])
    monkeypatch.setattr(nodes, "lost_nodes", lambda record, allocated: {"node3": "DOWN (Not responding)"})
    monkeypatch.setattr(nodes, "exclude", lambda job_id, nodelist: updates.append((job_id, nodelist)))
    outcome = supervisor(fake_launcher, spec, run, "fail", allocation=SlurmAllocation("7")).supervise()
    assert outcome.state == "REQUEUED" and outcome.attempts == 1 and slurm.requeued == ["7"]
    final = status(run)
    assert final["excluded_nodes"] == ["node3"] and final["node_failures"] == 1
    assert any(e["event"] == "nodes_left_behind" and e["cause"] == "node_failure" for e in run.read_events())


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
