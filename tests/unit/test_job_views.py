"""The words for the backends' records (launcher/cli/job_views.py) and the records' own errors
(launcher/backends/records.py): pure, records in and text out, so each case is written out here.
The same words on a real cluster: tests/slurm (status, explain, --wait)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.backends.records import (Fit, ForgottenJobError, JobInfo, NoLogYet, NoRunDirectory, Requeues,
                                       SchedulerUnreachable, SpareSwap, UnknownJobsError, history_fields)
from launcher.cli import job_views
from launcher.errors import SchedulerError
from launcher.states import Cause, JobState, StatusRecord


def backend(name="slurm", id_name="job id", scheduler_name="Slurm", info_fields=()):
    return SimpleNamespace(name=name, id_name=id_name, scheduler_name=scheduler_name, info_fields=info_fields)


def info(**fields):
    return JobInfo(**{"job_id": "12", "backend": "slurm", "state": JobState.RUNNING, **fields})


# --- lines under the table -----------------------------------------------------------------------

def test_requeues_are_counted_by_cause_with_the_excluded_nodes():
    assert job_views.note_lines(info()) == []
    one = Requeues(total=1, preemptions=1)
    assert job_views.note_lines(info(requeues=one)) == ["requeued 1 time: 1 preemption, 0 time limits"]
    many = Requeues(total=4, preemptions=0, timeouts=2, hangs=1, bad_nodes=1, excluded_nodes=("node2", "node5"))
    assert job_views.note_lines(info(requeues=many)) == [
        "requeued 4 times: 0 preemptions, 2 time limits, 1 hang, 1 bad-node requeue; excluded nodes: node2, node5"]
    no_list = Requeues(total=2, timeouts=1, bad_nodes=1)
    assert job_views.note_lines(info(requeues=no_list))[0].endswith("1 bad-node requeue; excluded nodes: none")


def test_spare_swaps_are_listed_with_their_causes_in_words():
    swaps = (SpareSwap(("node2",), ("node3",), Cause.NODE_FAILURE),
             SpareSwap(("node4", "node6"), ("node7", "node8"), Cause.HANG))
    assert job_views.note_lines(info(spare_swaps=swaps[:1])) == [
        "1 spare-node swap inside the allocation (no requeue): node2 -> node3 (node failure)"]
    assert job_views.note_lines(info(spare_swaps=swaps)) == [
        "2 spare-node swaps inside the allocation (no requeue): node2 -> node3 (node failure); "
        "node4 -> node7, node6 -> node8 (held up a hang)"]
    assert job_views.swap_text(SpareSwap(("node9",), (), Cause.HEALTH_CHECK)) == "node9 (failed the health check)"
    assert job_views.swap_text(SpareSwap(("node9",), ("node1",), "a new cause")) == "node9 -> node1 (a new cause)"


def test_a_status_records_history_becomes_the_records_parts():
    status = StatusRecord(state=JobState.RUNNING, requeues=3, preemptions=1, timeouts=1, hang_requeues=1,
                          node_failures=2, excluded_nodes=["node2"],
                          spare_swaps=[{"nodes": ["node4"], "spares": ["node5"], "cause": Cause.HEALTH_CHECK}])
    history = history_fields(status)
    assert history["requeues"] == Requeues(total=3, preemptions=1, timeouts=1, hangs=1, bad_nodes=2,
                                           excluded_nodes=("node2",))
    assert history["spare_swaps"] == (SpareSwap(("node4",), ("node5",), Cause.HEALTH_CHECK),)
    bare = history_fields(StatusRecord(state=JobState.RUNNING))
    assert bare == {"requeues": Requeues(), "spare_swaps": ()}
    assert SpareSwap.from_status({}) == SpareSwap((), (), "")


# --- the one line for a backend that could not be asked -----------------------------------------

def test_a_scheduler_that_cannot_be_asked_is_one_line_with_why_and_the_fix():
    unreachable = SchedulerUnreachable(["squeue"], 1, "", "slurm_load_jobs error: Unable to contact slurm controller",
                                       why="the controller does not answer", fix="check `scontrol ping`")
    assert job_views.not_asked_line(backend(), unreachable, 3) == (
        "Slurm could not be asked about the 3 jobs jaxlaunch submitted: the controller does not answer; "
        "fix: check `scontrol ping`")
    failed = SchedulerError(["squeue", "--me"], 1, "", "first line\n  squeue: error: Invalid user\n\n")
    assert job_views.not_asked_line(backend(), failed, 1) == (
        "Slurm could not be asked about the 1 job jaxlaunch submitted: squeue: error: Invalid user")
    silent = SchedulerError(["squeue"], 7, "", "")
    assert job_views.not_asked_line(backend(), silent, 2).endswith("the 2 jobs jaxlaunch submitted: squeue exited 7")
    no_why = SchedulerUnreachable(["squeue"], 1, "", "last words\n", why="")
    assert job_views.not_asked_line(backend(), no_why, 2).endswith("submitted: last words")


def test_another_error_or_a_backend_without_a_scheduler_says_the_error_on_one_line():
    error = RuntimeError("the spool is gone\n  fix: make it again\n")
    assert job_views.not_asked_line(backend(name="fake", scheduler_name=""), error, 1) == (
        "the fake backend's jobs could not be shown: the spool is gone; fix: make it again")
    assert job_views.not_asked_line(backend(), error, 1).startswith("the slurm backend's jobs could not be shown")


# --- the table ----------------------------------------------------------------------------------

def test_a_backend_with_ids_shows_them_and_the_run_dir_and_the_columns_it_fills():
    slurm = backend(info_fields=("elapsed", "nodes"))
    headers, rows = job_views.status_table(slurm, [
        info(state=JobState.PENDING, reason="Resources", elapsed="0:00", time_limit="1:00:00", nodes="2",
             run_dir=Path("/runs/a")),
        info(job_id="13", elapsed="0:42", nodes="1")])
    assert headers == ["JOBID", "STATE", "ELAPSED/LIMIT", "NODES", "RUN DIR"]
    assert rows == [["12", "PENDING (Resources)", "0:00/1:00:00", "2", "/runs/a"], ["13", "RUNNING", "0:42", "1", ""]]


def test_a_backend_without_ids_names_each_run_by_its_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = backend(name="local", id_name="", scheduler_name="", info_fields=("seconds", "result"))
    headers, rows = job_views.status_table(local, [
        info(state=JobState.COMPLETED, run_dir=tmp_path / "runs" / "a", seconds=3.25, result={"loss": 0.5, "w": [1]}),
        info(state=JobState.FAILED, run_dir=Path("/elsewhere/b"), failure="rank 1 failed first: " + "x" * 80)])
    assert headers == ["LOCAL RUN", "STATE", "DURATION", "RESULT"]
    assert rows[0] == ["runs/a", "COMPLETED", "3.2 s", '{"loss": 0.5}']
    assert rows[1][:3] == ["/elsewhere/b", "FAILED", ""]
    assert len(rows[1][3]) == job_views.RESULT_WIDTH and rows[1][3].endswith("...")
    assert job_views.job_label(local, info(run_dir=tmp_path / "runs" / "a")) == "runs/a"
    assert job_views.job_label(backend(), info()) == "job 12"


def test_a_result_cell_says_a_script_completed_without_a_value():
    assert job_views.result_cell(info(state=JobState.COMPLETED)) == job_views.NO_RESULT_WORDS
    assert job_views.result_cell(info(state=JobState.RUNNING)) == ""
    assert job_views.result_cell(info(state=JobState.COMPLETED, result=7)) == "7"
    exactly = "y" * job_views.RESULT_WIDTH
    assert job_views.result_cell(info(state=JobState.FAILED, failure=exactly)) == exactly


def test_a_job_its_scheduler_forgot_shows_its_last_word_or_says_so():
    assert job_views.state_cell(backend(), info(state=JobState.COMPLETED, scheduler_knows=False)) == "COMPLETED"
    assert job_views.state_cell(backend(), info(state=JobState.RUNNING, scheduler_knows=False)) == (
        "unknown: Slurm no longer knows it (last seen RUNNING)")
    assert job_views.wait_line("12", JobState.PENDING, "Priority") == "job 12: PENDING (Priority)"
    assert job_views.wait_line("12", JobState.RUNNING) == "job 12: RUNNING"


def test_explains_verdict_follows_the_fit():
    assert job_views.fit_lines(Fit(checked_against="the cluster")) == ["the request fits the cluster"]
    assert job_views.fit_lines(Fit(warnings=["no partition answered"], checked_against="the cluster")) == [
        "warning: no partition answered", "the request was not fully checked"]
    assert job_views.fit_lines(Fit(problems=["4 nodes, the partition has 2"], warnings=["w"],
                                   checked_against="the cluster")) == [
        "refused: 4 nodes, the partition has 2", "warning: w"]
    assert job_views.fit_lines(Fit()) == []


# --- the errors say themselves from their fields --------------------------------------------------

def test_unknown_ids_are_one_message_with_the_fix_where_a_scheduler_has_one():
    assert str(UnknownJobsError(["fake-9"], "fake")) == "no job fake-9 known to the fake backend"
    error = UnknownJobsError(["7", "8"], "slurm", "Slurm", Path("/home/u/.jaxlaunch/jobs.jsonl"), "squeue --me")
    assert str(error) == ("no jobs 7, 8 known to Slurm or to jaxlaunch (index: /home/u/.jaxlaunch/jobs.jsonl).\n"
                          "  fix: check the ids with `squeue --me` or `jaxlaunch status`.")
    assert error.ids == ["7", "8"] and error.backend == "slurm"
    assert str(UnknownJobsError(["7"], "slurm", "Slurm")) == (
        "no job 7 known to Slurm or to jaxlaunch.\n  fix: check the id with `jaxlaunch status`.")


# Made inside the test, not as parameters: an error made at collection would not run the code under test.
@pytest.mark.parametrize("make, said", [
    (lambda: ForgottenJobError("5", "fake"), "job 5: its fake backend does not know it"),
    (lambda: ForgottenJobError("5", "slurm", "Slurm", Path("/r")),
     "job 5 is not known to Slurm (run directory: /r): it ended and was purged before it was seen to finish, or "
     "the id is wrong.\n  fix: see `jaxlaunch logs 5` and the run directory's status.json."),
    (lambda: ForgottenJobError("5", "slurm", "Slurm"),
     "job 5 is not known to Slurm: it ended and was purged before it was seen to finish, or "
     "the id is wrong.\n  fix: see `jaxlaunch logs 5` and the run directory's status.json."),
    (lambda: NoRunDirectory("5", "fake"), "job 5 has no run directory that jaxlaunch knows.\n"
                                          "  fix: name its run directory (RUN_DIR) instead."),
    (lambda: NoRunDirectory("5", "slurm", Path("/i.jsonl")),
     "job 5 has no run directory that jaxlaunch knows: it was not submitted by jaxlaunch from this account "
     "(index: /i.jsonl).\n  fix: name its run directory (RUN_DIR) instead of the id, if it has one."),
    (lambda: NoLogYet("5", None, Path("/r/out.log")), "no log yet at /r/out.log"),
    (lambda: NoLogYet("5", 3, Path("/r/logs/rank-3.log")), "no log yet at /r/logs/rank-3.log (does rank 3 exist?)"),
    (lambda: UnknownJobsError(["fake-9"], "fake"), "no job fake-9 known to the fake backend"),
])
def test_each_error_says_itself_from_its_fields(make, said):
    error = make()
    assert str(error) == said and error.args == (said,)  # args too: what pickling and logging keep


def test_an_unreachable_scheduler_keeps_the_failed_command():
    error = SchedulerUnreachable(["squeue", "--me"], 1, "out", "err", why="no controller", fix="start it")
    assert (error.argv, error.returncode, error.stdout, error.stderr) == (["squeue", "--me"], 1, "out", "err")
    assert (error.why, error.fix) == ("no controller", "start it")
    assert SchedulerUnreachable(["sinfo"], 2, "", "", why="w").fix == ""


def test_a_swap_without_spares_lists_every_node_it_left():
    assert job_views.swap_text(SpareSwap(("node2", "node4"), (), Cause.NODE_FAILURE)) == "node2, node4 (node failure)"
