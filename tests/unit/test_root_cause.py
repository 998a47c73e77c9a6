"""failure.json from what mpirun and srun really print (texts captured on the local cluster)."""

import pytest

from launcher.launchers import srun
from launcher.supervisor import root_cause

PRTE_SIGNAL = """--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 3790 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------"""
PRTE_EXIT_CODE = """prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:
   Process name: [prterun-vm-3769@1,1]
   Exit code:    3"""
PRTE_IMPROPER = """prterun has exited due to process rank 1 with PID 3756 on node vm exiting
improperly. There are three reasons this could occur:"""
PRTE_PEER_LOST = """An MPI communication peer process has unexpectedly disconnected.  This
usually indicates a failure in the peer process (e.g., a crash or
  Local host: node1
  Local PID:  15383
  Peer host:  node2
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node node1 calling
"abort". This may have caused other processes in the application to be"""
SRUN_EXIT3 = """srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node1: error: *** STEP 6.0 ON node1 CANCELLED AT 2026-11-22T14:16:48 ***
srun: error: node2: task 1: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=6.0
srun: error: node1: task 0: Killed"""
SRUN_SEGFAULT = """srun: error: node2: task 1: Segmentation fault (core dumped)
srun: error: node1: tasks 0,2-3: Exited with exit code 14"""


def build(reports, every_task, **kw):
    args = dict(state="FAILED", reason="failed", num_processes=2, rank_errors=[], abort_requests=[],
                launcher_reports=reports, reports_every_task=every_task, finished_ranks=set(),
                started_ranks={0: "node1", 1: "node2"}, rank_states=[], log_tail=lambda rank: "",
                launcher_exit_code=1, attempt=0, seen_at=100.0)
    return root_cause.build_failure(**{**args, **kw})


def test_prte_signal_exit_code_and_improper_exit():
    (killed,), every = root_cause.parse_launcher_messages(PRTE_SIGNAL)
    assert not every
    assert killed == {"rank": 1, "host": "vm", "exit_code": None, "signal": "SIGKILL", "error": "killed by SIGKILL",
                      "source": "launcher"}
    (exited,), _ = root_cause.parse_launcher_messages(PRTE_EXIT_CODE)
    assert (exited["rank"], exited["exit_code"]) == (1, 3)
    (improper,), _ = root_cause.parse_launcher_messages(PRTE_IMPROPER)
    assert improper["rank"] == 1 and "without MPI_Finalize" in improper["error"]


def test_srun_reports_in_order_and_the_first_is_the_cause():
    reports, every = root_cause.parse_launcher_messages(SRUN_EXIT3, srun.task_reports)
    assert every and [(r["rank"], r["exit_code"], r["signal"]) for r in reports] == [(1, 3, None), (0, None, "SIGKILL")]
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["torn_down_ranks"] == [0]
    assert failure["summary"] == "rank 1 on node2 failed first: exited with code 3"
    reports, _ = root_cause.parse_launcher_messages(SRUN_SEGFAULT, srun.task_reports)
    assert [r["rank"] for r in reports] == [1, 0, 2, 3] and reports[0]["signal"] == "SIGSEGV"


def test_a_rank_that_vanished_under_srun_is_the_cause():
    reports, every = root_cause.parse_launcher_messages("srun: error: node1: task 0: Exited with exit code 14",
                                                        srun.task_reports)
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["error"].startswith("vanished")
    assert failure["torn_down_ranks"] == [0]


def test_the_peer_of_a_lost_connection_is_the_cause_not_the_rank_mpirun_names():
    reports, every = root_cause.parse_launcher_messages(PRTE_PEER_LOST)
    assert reports[0]["rank"] == 0
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["host"] == "node2"
    crashed = build(reports, every, log_tail=lambda rank: "Fatal Python error: Segmentation fault\n\nThread 0x1" if rank == 1 else "")
    assert crashed["first_failure"]["signal"] == "SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in crashed["first_failure"]["error"]


PRTE_SOCKET_CLOSED = """[node1:00000] *** An error occurred in Socket closed
[node1:00000] *** reported by process [1079050241,0]
[node1:00000] *** on a NULL communicator
[node1:00000] *** Unknown error
[node1:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,
[node1:00000] ***    and MPI will try to terminate your MPI job as well)
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 24718 on node node1 calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here)."""


def test_a_socket_closed_abort_is_a_victim_and_the_vanished_peer_the_cause():
    """CI, Slurm, mpirun mode: rank 1 got SIGKILL; rank 0's MPI saw the socket close and aborted
    before prterun reported the signal, naming no peer host."""
    reports, every = root_cause.parse_launcher_messages(PRTE_SOCKET_CLOSED)
    assert reports[0]["rank"] == 0 and reports[0]["error"] == "called MPI_Abort after a peer closed its socket"
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["error"].startswith("vanished")
    assert failure["torn_down_ranks"] == [0]


SRUN_PEER_KILLED = """srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
srun: error: node1: task 0: Exited with exit code 14
srun: launch/slurm: _step_signal: Terminating StepId=16.0
srun: error: node2: task 1: Killed"""


def test_srun_reports_the_mpi_abort_of_the_victim_before_the_killed_peer():
    """CI, Slurm, srun mode: rank 1 got SIGKILL; rank 0's MPI library aborted (exit code 14,
    MPI_ERR_UNKNOWN) and srun reported that first."""
    reports, every = root_cause.parse_launcher_messages(SRUN_PEER_KILLED, srun.task_reports)
    assert [r["rank"] for r in reports] == [0, 1] and every
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["signal"] == "SIGKILL"
    assert failure["torn_down_ranks"] == [0]


SRUN_TEARDOWN_KILL_FIRST = """srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node1: error: *** STEP 21.0 ON node1 CANCELLED AT 2026-11-27T17:02:11 ***
srun: error: node1: task 0: Killed
srun: launch/slurm: _step_signal: Terminating StepId=21.0
srun: error: node2: task 1: Segmentation fault (core dumped)"""


def test_srun_names_the_teardowns_kill_before_the_segfault_that_caused_it():
    """CI (2026-11-27), Slurm, srun mode: rank 1 segfaulted; srun's teardown (--kill-on-bad-exit)
    killed rank 0 and srun said so first. The crash is the cause, the SIGKILL the teardown."""
    reports, every = root_cause.parse_launcher_messages(SRUN_TEARDOWN_KILL_FIRST, srun.task_reports)
    assert [r["rank"] for r in reports] == [0, 1] and every
    failure = build(reports, every)
    assert failure["first_failure"]["rank"] == 1 and failure["first_failure"]["signal"] == "SIGSEGV"
    assert failure["summary"] == "rank 1 on node2 failed first: killed by SIGSEGV"
    assert failure["torn_down_ranks"] == [0]


@pytest.mark.parametrize("cause", ["Exited with exit code 3", "Aborted", "Bus error"])
def test_an_exit_code_or_crash_of_the_programs_own_wins_over_a_teardown_signal(cause):
    for victim in ("Killed", "Terminated"):
        text = f"srun: error: node1: task 0: {victim}\nsrun: error: node2: task 1: {cause}"
        reports, every = root_cause.parse_launcher_messages(text, srun.task_reports)
        assert build(reports, every)["first_failure"]["rank"] == 1, (victim, cause)


def test_a_kill_alone_is_the_cause_and_the_first_of_two_kills_wins():
    """The out-of-memory killer's SIGKILL, with only MPI's abort or another kill beside it."""
    for text, first in [("srun: error: node1: task 0: Exited with exit code 14\nsrun: error: node2: task 1: Killed", 1),
                        ("srun: error: node2: task 1: Killed\nsrun: error: node1: task 0: Killed", 1),
                        ("srun: error: node1: task 0: Killed\nsrun: error: node2: task 1: Terminated", 0)]:
        reports, every = root_cause.parse_launcher_messages(text, srun.task_reports)
        assert build(reports, every)["first_failure"]["rank"] == first, text


def test_own_record_wins_and_launcher_reports_after_it_are_teardown():
    reports, every = root_cause.parse_launcher_messages(SRUN_EXIT3, srun.task_reports)
    own = {"rank": 1, "host": "node2", "time": 50.0, "exit_code": 3, "signal": None, "traceback": "Traceback...",
           "error": "SystemExit: sys.exit(3) called"}
    failure = build(reports, every, rank_errors=[own])
    assert [r["rank"] for r in failure["failed_ranks"]] == [1]
    assert failure["summary"] == "rank 1 on node2 failed first: SystemExit: sys.exit(3) called"


def test_first_failure_is_the_earliest_and_others_are_listed():
    errors = [{"rank": 1, "host": "b", "time": 20.0, "error": "B: late"},
              {"rank": 0, "host": "a", "time": 10.0, "error": "A: early"}]
    failure = build([], False, rank_errors=errors, num_processes=3)
    assert failure["first_failure"]["rank"] == 0 and failure["torn_down_ranks"] == [2]
    lines = root_cause.summary_lines(failure)
    assert lines == ["FAILED: rank 0 on a failed first: A: early", "  also failed: rank 1: B: late",
                     "  stopped only because the job was torn down: rank 2"]


def test_hang_report_names_ranks_that_never_arrived():
    states = [{"rank": 0, "host": "a", "where": "job.py:3 in f", "collectives_started": 7,
               "waiting_in": {"seq": 7, "name": "allreduce", "seconds": 31.0}},
              {"rank": 1, "host": "b", "where": "job.py:9 in g", "collectives_started": 6, "waiting_in": None}]
    request = {"reason": "collective_timeout", "collective": {"seq": 7, "name": "allreduce", "seconds": 30.2}}
    hang = root_cause.hang_report(3, states, [request])
    assert hang["never_arrived"] == [1]
    assert root_cause.hang_lines(hang) == [
        "collective watchdog: allreduce #7 waited 30 s; ranks that never arrived: 1",
        "  rank 0 (a): in allreduce #7 for 31.0 s, at job.py:3 in f",
        "  rank 1 (b): not in a collective (6 started), at job.py:9 in g",
        "  rank 2: did not answer (dead, or stuck in C code holding the GIL)"]


def test_summary_ends_with_the_failing_ranks_last_log_lines_read_from_the_end(tmp_path):
    from launcher.rundir import RunDirectory

    run = RunDirectory(tmp_path)
    run.logs.mkdir()
    filler = "".join(f"step {i} loss 0.5\n" for i in range(200_000))  # ~3.7 MB before the end
    run.rank_log(1).write_text(filler + "loading shard 7\n\n  ValueError: shard 7 is empty\n")
    failure = {"state": "FAILED", "summary": "rank 1 raised ValueError", "reason": "failed",
               "first_failure": {"rank": 1}, "failed_ranks": [{"rank": 1}]}
    lines = root_cause.summary_lines(failure, tmp_path)
    start = lines.index(f"  last lines of rank 1's log ({run.rank_log(1)}):")
    assert lines[start + 1:start + 6] == ["    step 199997 loss 0.5", "    step 199998 loss 0.5",
                                          "    step 199999 loss 0.5", "    loading shard 7",
                                          "      ValueError: shard 7 is empty"]
    assert lines[-1] == f"  details: {tmp_path}/failure.json"
    assert not any("last lines" in line for line in root_cause.summary_lines({**failure, "reason": "timeout"},
                                                                             tmp_path))


def test_first_failure_is_the_earliest_even_when_a_lower_rank_fails_later():
    """Rank 1 fails at t=10, rank 0 at t=20: rank 1 is the cause, whatever the rank order."""
    errors = [{"rank": 0, "host": "a", "time": 20.0, "error": "A: late"},
              {"rank": 1, "host": "b", "time": 10.0, "error": "B: early"}]
    failure = build([], False, rank_errors=errors, num_processes=3)
    assert failure["first_failure"]["rank"] == 1
    assert [r["rank"] for r in failure["failed_ranks"]] == [1, 0]
    assert failure["summary"] == "rank 1 on b failed first: B: early"
    assert root_cause.summary_lines(failure) == [
        "FAILED: rank 1 on b failed first: B: early", "  also failed: rank 0: A: late",
        "  stopped only because the job was torn down: rank 2"]


def test_failures_at_the_same_time_go_by_rank_and_untimed_ones_last():
    errors = [{"rank": 2, "host": "c", "time": None, "error": "C: untimed"},
              {"rank": 1, "host": "b", "time": 10.0, "error": "B"},
              {"rank": 0, "host": "a", "time": 10.0, "error": "A"}]
    failure = build([], False, rank_errors=errors, num_processes=3)
    assert [r["rank"] for r in failure["failed_ranks"]] == [0, 1, 2]
    assert failure["torn_down_ranks"] == []


def test_a_ranks_own_error_before_the_launchers_report_of_another_rank_is_the_cause():
    """A rank that recorded its own error is the cause; the rank mpirun reports afterwards was
    ended by the teardown."""
    reports, every = root_cause.parse_launcher_messages(PRTE_SIGNAL)  # rank 1 killed by SIGKILL
    own = {"rank": 0, "host": "node1", "time": 50.0, "error": "ValueError: bad shard", "exit_code": 1,
           "signal": None}
    failure = build(reports, every, rank_errors=[own])
    assert failure["first_failure"]["rank"] == 0
    assert [r["rank"] for r in failure["failed_ranks"]] == [0] and failure["torn_down_ranks"] == [1]


def test_summary_of_a_left_early_stop_ends_with_the_ranks_last_log_lines(tmp_path):
    from launcher.rundir import RunDirectory

    run = RunDirectory(tmp_path)
    run.logs.mkdir()
    run.rank_log(1).write_text("step 1\nreturning early\n")
    failure = {"state": "FAILED", "summary": "rank 1 failed first: left main early: ...", "reason": "left_early",
               "first_failure": {"rank": 1}, "failed_ranks": [{"rank": 1}], "torn_down_ranks": [0]}
    lines = root_cause.summary_lines(failure, tmp_path)
    assert lines[1:] == ["  stopped only because the job was torn down: rank 0",
                         f"  last lines of rank 1's log ({run.rank_log(1)}):", "    step 1", "    returning early",
                         f"  details: {tmp_path}/failure.json"]


def test_a_stop_with_no_failing_rank_lists_no_torn_down_ranks():
    """A timeout or a cancel: every rank was torn down, none is blamed, the hang report says where
    each one was."""
    failure = build([], False, state="TIMEOUT", reason="timeout", detail="timed out after 8 s (the spec's timeout)",
                    started_ranks={}, rank_states=[{"rank": 0, "host": "a", "where": "job.py:3 in f",
                                                    "collectives_started": 2, "waiting_in": None}])
    assert failure["first_failure"] is None and failure["torn_down_ranks"] == [0, 1]
    assert failure["summary"] == "timed out after 8 s (the spec's timeout)"
    assert root_cause.summary_lines(failure) == [
        "TIMEOUT: timed out after 8 s (the spec's timeout)",
        "roll-call: no rank waits for a peer (rank 0 on a: in its own code at job.py:3 in f; rank 1 did not answer "
        "(dead, or stuck in C code holding the GIL))",
        "  rank 0 (a): not in a collective (2 started), at job.py:3 in f",
        "  rank 1: did not answer (dead, or stuck in C code holding the GIL)"]
    assert failure["hang"]["roll_call"]["culprits"] == []  # nobody waits for a peer: nobody is blamed


def test_a_cancel_shows_no_teardown_words_and_says_how_to_get_every_stack():
    """Issue 29: a plain scancel of an mpirun job showed Open MPI's `--debug-daemons` advice (its
    words as Slurm killed its daemons) as if it explained something."""
    teardown = ["srun returned non-zero exit status (36608) from launching", "the per-node daemon.",
                '* "--debug-daemons"']
    failure = build([], False, state="CANCELLED", reason="cancelled", detail="cancelled by SIGTERM",
                    started_ranks={}, launcher_tail=teardown,
                    rank_states=[{"rank": 1, "host": "b", "where": "job.py:3 in f", "collectives_started": 2,
                                  "waiting_in": None}])
    assert root_cause.summary_lines(failure) == [
        "CANCELLED: cancelled by SIGTERM",
        "  rank 0: did not answer (dead, or stuck in C code holding the GIL)",
        "  rank 1 (b): not in a collective (2 started), at job.py:3 in f",
        "  (a plain scancel ends mpirun's ranks at once, before they can answer; `jaxlaunch cancel` asks them "
        "for their stacks first)"]


def test_a_local_ctrl_c_gets_no_scancel_hint(tmp_path):
    """Issue 44, item 12: a local Ctrl-C printed a hint about scancel. Only a run that a scheduler
    queued (its status has the scheduler's job id) gets it."""
    from launcher.rundir import RunDirectory
    from launcher.spec import JobSpec

    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    run.update_status(backend="local")
    failure = build([], False, state="CANCELLED", reason="cancelled", detail="cancelled by Ctrl-C (SIGINT)",
                    started_ranks={}, rank_states=[])
    lines = root_cause.summary_lines(failure, run.path)
    assert lines[0] == "CANCELLED: cancelled by Ctrl-C (SIGINT)" and not any("scancel" in line for line in lines)
    run.update_status(job_id="1234")
    assert any("plain scancel" in line for line in root_cause.summary_lines(failure, run.path))
