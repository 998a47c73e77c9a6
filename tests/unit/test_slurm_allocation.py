"""SlurmAllocation's own answers (launcher/backends/slurm/allocation.py and requeue.py): what a
preemption notice, Slurm's record of a cancel or a time limit, a requeue Slurm made itself, or a
lost node lead to for a batch job, with a made-up `scontrol show job` record and `scontrol
requeue` recorded (the `slurm` fixture: tests/supervision_helpers.py). Most run the real
Supervisor with a SlurmAllocation, as the batch program does; what the supervisor itself does
with an allocation's answers is tested with a scripted one in test_supervisor_units.py. Spare
nodes: test_spare_nodes.py."""

import json
import os
import time
from datetime import datetime

import pytest

from launcher.backends.slurm import nodes, requeue
from launcher.backends.slurm.allocation import SlurmAllocation
from launcher.rundir import RunDirectory
from launcher.spec import JobSpec
from launcher.spec.model import SlurmSpec
from launcher.states import JobState
from launcher.supervisor.allocation import NodeAction
from launcher.supervisor.supervise import Supervisor
from supervision_helpers import (end_time, fake_launcher, make_run, quick_stops, seen, slurm, status,  # noqa: F401
                                 supervisor)


# --- a preemption notice, a requeue, the requeue limit ----------------------------------------------

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


def notice_after_requeues(fake_launcher, tmp_path, monkeypatch, requeues, max_requeues):
    """A batch job Slurm has requeued `requeues` times (preemptions), started again and given a
    preemption notice: its run directory and the supervisor's outcome."""
    spec, run = make_run(tmp_path, max_requeues=max_requeues)
    run.update_status(state="REQUEUED", attempts=requeues, requeues=requeues, preemptions=requeues)
    monkeypatch.setenv(requeue.RESTART_COUNT_ENV, str(requeues))
    return run, supervisor(fake_launcher, spec, run, "stop", allocation=SlurmAllocation("7"), resume=True).supervise()


@pytest.mark.parametrize("requeues, max_requeues", [(0, 0), (1, 1), (3, 3)])
def test_a_notice_once_max_requeues_are_spent_ends_the_job_failed(fake_launcher, tmp_path, slurm, monkeypatch,
                                                                    requeues, max_requeues):
    run, outcome = notice_after_requeues(fake_launcher, tmp_path, monkeypatch, requeues, max_requeues)
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
    run, outcome = notice_after_requeues(fake_launcher, tmp_path, monkeypatch, requeues, max_requeues)
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



# --- nodes left behind by a requeue --------------------------------------------------------------

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


def test_a_lost_node_is_left_behind_by_a_requeue_that_excludes_it(tmp_path, slurm, monkeypatch):
    """Slurm's side of a node lost under a failed attempt (the supervisor's side:
    test_supervisor_units.py, test_a_node_lost_under_a_failed_attempt_is_left_behind_through_the_allocation):
    SlurmAllocation.lost_nodes names it, and its decision, with no spare, is a requeue that
    excludes it, counts it and logs it."""
    spec, run = make_run(tmp_path, max_restarts=2)
    updates = []
    monkeypatch.setattr(nodes, "allocated_nodes", lambda env=os.environ: ["node2", "node3"])
    monkeypatch.setattr(nodes, "lost_nodes", lambda record, allocated: {"node3": "DOWN (Not responding)"})
    monkeypatch.setattr(nodes, "exclude", lambda job_id, nodelist: updates.append((job_id, nodelist)))
    allocation = SlurmAllocation("7").bind(spec, run, lambda line: None)
    lost = allocation.lost_nodes()
    assert lost == {"node3": "DOWN (Not responding)"}
    decision = allocation.replace_nodes(lost, "node_failure", None, 0)
    assert (decision.action, decision.state) == (NodeAction.REQUEUE, JobState.REQUEUED)
    allocation.finish(decision.state, "node_failure")
    assert slurm.requeued == ["7"] and updates == [("7", "node3")]
    final = status(run)
    assert final["excluded_nodes"] == ["node3"] and final["node_failures"] == 1
    assert any(e["event"] == "nodes_left_behind" and e["cause"] == "node_failure" for e in run.read_events())
