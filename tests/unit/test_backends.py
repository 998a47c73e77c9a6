"""The backend seam: typed states and their one exit-code table, the batched Slurm watcher, and
the bugs the split between the CLI, the API and the backends used to cause."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import launcher
from launcher.backends.slurm.backend import SlurmBackend
from launcher.backends.slurm.job import SlurmJob
from launcher.backends.slurm.watcher import SlurmWatcher
from launcher.cli import main
from launcher.errors import SpecError, UsageError
from launcher.rundir import RunDirectory
from launcher.backends.slurm import scheduler
from launcher.backends.slurm.submission import render_for_submission
from launcher.spec import JobSpec
from launcher.states import FINAL_STATES, JobState, StatusRecord

EXPECTED_EXIT_CODES = {"COMPLETED": 0, "FAILED": 1, "TIMEOUT": 124, "CANCELLED": 143, "PREEMPTED": 75,
                       "OUT_OF_MEMORY": 1, "SUBMIT_FAILED": 1}


# --- states ----------------------------------------------------------------------------------

def test_every_final_state_has_one_exit_code_for_run_submit_and_the_api():
    assert sorted(FINAL_STATES) == sorted(EXPECTED_EXIT_CODES)
    for name, code in EXPECTED_EXIT_CODES.items():
        assert JobState(name).final and JobState(name).exit_code() == code, name
    assert JobState.CANCELLED.exit_code(signal.SIGINT) == 130 and JobState.CANCELLED.exit_code(signal.SIGHUP) == 129
    for name in ("PENDING", "SUBMITTED", "RUNNING", "SUSPENDED", "REQUEUED", "UNKNOWN"):
        assert not JobState(name).final, name
    assert JobState.COMPLETED == "COMPLETED" and f"{JobState.TIMEOUT}" == "TIMEOUT"
    assert JobState.parse("NO_SUCH_STATE") is JobState.UNKNOWN


def test_the_supervisor_uses_the_same_exit_code_table():
    from launcher.supervisor.supervise import exit_code_for

    for name, code in EXPECTED_EXIT_CODES.items():
        assert exit_code_for(name) == code, name
    assert exit_code_for("CANCELLED", signal.SIGINT) == 130


def test_status_json_is_one_typed_record_with_a_version(tmp_path):
    run = RunDirectory(tmp_path)
    assert run.status() == StatusRecord() and run.status().state is JobState.PENDING
    run.update_status(state=JobState.RUNNING, attempts=1)
    written = json.loads(run.status_file.read_text())
    assert written["state"] == "RUNNING" and written["version"] == 1 and written["attempts"] == 1
    assert run.status().state is JobState.RUNNING
    with pytest.raises(TypeError, match="status.json has no field stat"):
        run.update_status(stat="COMPLETED")  # a misspelt field is refused, not written
    run.status_file.write_text(json.dumps({"state": "COMPLETED", "from_a_newer_jaxlaunch": 1}))
    assert run.status().state is JobState.COMPLETED  # unknown keys are read past


# --- Slurm: submit -----------------------------------------------------------------------------

def no_mpirun():
    raise UsageError("mpirun not found")


def test_an_srun_job_renders_on_a_login_node_without_mpirun(monkeypatch, tmp_path):
    monkeypatch.setattr("launcher.backends.slurm.submission.find_mpirun", no_mpirun)
    spec = JobSpec(name="x", entrypoint="m:f", nodes=2, slurm={"launch": "srun"})
    script = render_for_submission(spec, tmp_path)
    assert "srun --mpi=pmix" in script and "mpirun" not in script
    with pytest.raises(UsageError, match="mpirun not found"):  # an mpirun job does need it
        render_for_submission(spec.replace(slurm={"launch": "mpirun"}), tmp_path)


@pytest.mark.parametrize("setup, index, said", [
    (["("], 0, "syntax error"),
    (["module load cuda", 'echo "unterminated'], 1, "unexpected EOF"),
    (["if true; then echo ok"], 0, "syntax error"),
])
def test_a_setup_line_bash_cannot_parse_is_refused_before_sbatch_naming_it(setup, index, said, tmp_path):
    spec = JobSpec(name="x", entrypoint="m:f", setup=setup)
    prefix = re.escape(f"setup[{index}] ({setup[index]!r}) is not valid bash: ")
    with pytest.raises(SpecError, match=f"^{prefix}[^\\n]*{said}"):
        render_for_submission(spec, tmp_path)


def test_submit_refuses_a_broken_setup_line_with_exit_2_and_submits_nothing(write_spec, tmp_path, monkeypatch):
    submitted = []
    monkeypatch.setattr(scheduler, "submit", submitted.append)
    spec = write_spec("name: x\nentrypoint: m:f\nsetup:\n  - module load cuda\n  - '('\n")
    result = CliRunner().invoke(main, ["submit", str(spec), "--run-dir", str(tmp_path / "run"), "--no-check"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: setup[1] ('(') is not valid bash: ")
    assert submitted == [] and not (tmp_path / "run").exists()


# --- Slurm: the watcher ----------------------------------------------------------------------

class CountingScheduler:
    def __init__(self, monkeypatch, states):
        self.states, self.calls = states, []
        monkeypatch.setattr(scheduler, "query_jobs", self)

    def __call__(self, job_ids):
        self.calls.append(list(job_ids))
        return {j: scheduler.SlurmRecord(j, s, *scheduler.translate_state(s), "0:01", "1", "fake")
                for j, s in self.states.items() if j in job_ids}


def test_many_handles_share_one_batched_query(monkeypatch):
    fake = CountingScheduler(monkeypatch, {f"5_{i}": "PENDING" for i in range(20)})
    watcher = SlurmWatcher()
    jobs = [SlurmJob(f"5_{i}", None, watcher) for i in range(20)]
    assert [repr(j) for j in jobs][0] == "SlurmJob(id='5_0', run_dir='None')" and fake.calls == []  # repr: no I/O
    assert SlurmBackend(watcher).states(jobs) == {j.id: JobState.PENDING for j in jobs}
    assert len(fake.calls) == 1 and sorted(fake.calls[0]) == sorted(j.id for j in jobs)
    for job in jobs:  # within the refresh interval: answered from the batch
        assert job.state() == JobState.PENDING
    assert len(fake.calls) == 1
    fake.states["5_3"] = "COMPLETED"
    assert jobs[3].slurm_record(max_age=0).state == "COMPLETED"
    assert len(fake.calls) == 2 and len(fake.calls[1]) == 20  # one query refreshed every unfinished job
    jobs[3].state(), jobs[3].state()
    assert all("5_3" not in call for call in fake.calls[2:])  # a finished job is never asked about again


def test_wait_backs_off_instead_of_polling_every_half_second(monkeypatch):
    """Both the handle's sleeps and the watcher's refreshes grow 1.5x while nothing changes."""
    fake = CountingScheduler(monkeypatch, {"9": "PENDING"})
    now = [0.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds
    monkeypatch.setattr("launcher.backends.base.time.sleep", sleep)
    monkeypatch.setattr("launcher.backends.base.time.monotonic", lambda: now[0])
    monkeypatch.setattr("launcher.backends.slurm.watcher.time.monotonic", lambda: now[0])
    watcher = SlurmWatcher()
    with pytest.raises(TimeoutError):
        SlurmJob("9", None, watcher).wait(timeout=120)
    assert sleeps[:4] == [0.5, 0.75, 1.125, 1.6875] and max(sleeps) == 10.0
    # 120 s of waiting: a poll every 0.5 s was 240 queries; now a dozen or so
    assert 5 <= len(fake.calls) <= 20, len(fake.calls)
    assert watcher.interval == 10.0
    fake.states["9"] = "RUNNING"  # a change brings the interval back down
    watcher.refresh()
    assert watcher.interval == 1.0


def test_a_job_whose_supervisor_wrote_its_end_costs_no_scheduler_call(monkeypatch, tmp_path):
    """The supervisor knows why the job ended (its own timeout: TIMEOUT, exit 124) better than
    Slurm (FAILED, for the batch script's exit code 124), and asking Slurm again is not needed."""
    fake = CountingScheduler(monkeypatch, {"41": "FAILED"})
    run = RunDirectory(tmp_path)
    run.update_status(state=JobState.TIMEOUT, backend="slurm", job_id="41", exit_code=124)
    job = SlurmJob("41", run, SlurmWatcher())
    assert job.state() == JobState.TIMEOUT and job.done() and job.exit_code() == 124
    assert fake.calls == []
    run.update_status(state=JobState.RUNNING)  # still running by its own account: Slurm is asked
    assert job.state() == JobState.FAILED and len(fake.calls) == 1
    assert run.status().state == JobState.FAILED and run.status().slurm_state == "FAILED"  # and recorded


@pytest.mark.parametrize("slurm_state, code", [("COMPLETED", 0), ("FAILED", 1), ("TIMEOUT", 124),
                                               ("CANCELLED", 143), ("PREEMPTED", 75), ("OUT_OF_MEMORY", 1)])
def test_submit_wait_exits_with_the_same_code_as_run(slurm_state, code, write_spec, tmp_path, monkeypatch):
    """A state Slurm decided (the job's supervisor never wrote one) maps through the one table."""
    monkeypatch.setenv("JAXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(scheduler, "submit", lambda script: "31")
    CountingScheduler(monkeypatch, {"31": slurm_state})
    result = CliRunner().invoke(main, ["submit", str(write_spec("name: x\nentrypoint: m:f\n")), "--run-dir",
                                       str(tmp_path / "run"), "--wait", "--no-check"])
    assert result.exit_code == code, result.output
    assert f"job 31: {slurm_state}" in result.output
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == slurm_state


# --- local runs found by their run directory ---------------------------------------------------


def test_an_exited_supervisor_not_yet_reaped_by_its_parent_is_not_running():
    # A script that started `jaxlaunch run` and has not waited for it yet leaves a zombie, which /proc
    # still lists: cancel took its full 60 s grace waiting for it to "exit" (this file's cancel test did).
    from launcher.backends.local.backend import _start_ticks

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    running = _start_ticks(child.pid)  # it waits for its stdin to close
    child.stdin.close()
    deadline = time.monotonic() + 30
    while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    try:
        assert running is not None and _start_ticks(os.getpid()) is not None
        assert _start_ticks(child.pid) is None
    finally:
        child.wait()


class ScriptedJob(launcher.backends.base.Job):
    """A handle whose state() answers the given states in turn."""
    backend = "scripted"

    def __init__(self, states):
        super().__init__("scripted", None)
        self.states = iter(states)

    def state(self):
        return next(self.states)

    def logs(self, rank=None):
        return ""

    def cancel(self):
        pass


def test_wait_backs_off_again_after_a_state_change(monkeypatch):
    """Issue 29: a change brings the poll back to 0.5 s, and it grows 1.5x again from there."""
    sleeps = []
    monkeypatch.setattr("launcher.backends.base.time.sleep", sleeps.append)
    job = ScriptedJob([JobState.PENDING] * 4 + [JobState.RUNNING] * 5 + [JobState.COMPLETED])
    changes = []
    assert job.wait(on_change=lambda handle, state: changes.append(state)) == JobState.COMPLETED
    assert changes == [JobState.PENDING, JobState.RUNNING, JobState.COMPLETED]
    growing = [0.5, 0.75, 1.125, 1.6875, 2.53125]
    assert sleeps == pytest.approx(growing[:4] + growing[:5])


@pytest.mark.parametrize("supervisor", ["on another host", "no recorded pid", "gone from this host"])
def test_a_found_run_whose_supervisor_cannot_be_checked_is_left_alone(tmp_path, monkeypatch, supervisor):
    """Issue 29: only a supervisor known to be gone (this host, its pid and start time) makes a found
    run FAILED and its processes killed; one that cannot be checked from here is left running."""
    import socket

    from launcher.backends.local.backend import LocalJob, _start_ticks
    from launcher.supervisor import processes

    killed = []
    monkeypatch.setattr(processes, "kill_job_processes", lambda run_dir, grace=2.0: killed.append(run_dir) or [])
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()  # a pid that names no process now
    assert _start_ticks(exited.pid) is None
    recorded = {"on another host": {"supervisor_pid": exited.pid, "supervisor_start": 12345,
                                    "supervisor_host": "another-host-" + socket.gethostname()},
                "no recorded pid": {"supervisor_host": socket.gethostname()},
                "gone from this host": {"supervisor_pid": exited.pid, "supervisor_start": 12345,
                                        "supervisor_host": socket.gethostname()}}[supervisor]
    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    run.update_status(state=JobState.RUNNING, backend="local", **recorded)
    job = LocalJob(run)
    if supervisor == "gone from this host":  # the one case that can be told: recorded FAILED, its processes ended
        assert job.state() == JobState.FAILED and killed == [run.path]
        return
    assert job.state() == JobState.RUNNING and not job.done()
    assert killed == [] and run.status().state == JobState.RUNNING and run.status().reason is None


def test_the_cli_words_a_jobs_record_the_backend_writes_none():
    """The seam answers with records (launcher/backends/records.py); launcher/cli/job_views.py words them."""
    from launcher.backends.records import Fit, JobInfo, Requeues, SpareSwap
    from launcher.cli import job_views

    info = JobInfo("7", "slurm", JobState.PENDING, reason="Resources", elapsed="0:00", time_limit="1:00:00",
                   requeues=Requeues(total=2, preemptions=1, timeouts=1),
                   spare_swaps=(SpareSwap(("node2",), ("node3",), "node_failure"),))
    assert job_views.state_text(info.state, info.reason) == "PENDING (Resources)"
    assert job_views.elapsed_cell(info) == "0:00/1:00:00"
    assert job_views.note_lines(info) == [
        "requeued 2 times: 1 preemption, 1 time limit",
        "1 spare-node swap inside the allocation (no requeue): node2 -> node3 (node failure)"]
    assert job_views.fit_verdict(Fit([], [], "the cluster")) == "the request fits the cluster"
    assert job_views.fit_verdict(Fit([], ["no GPUs listed"], "the cluster")) == "the request was not fully checked"
    assert job_views.fit_verdict(Fit(["too many nodes"], [], "the cluster")) is None
    assert job_views.fit_verdict(Fit()) is None  # a backend that checks against nothing of its own says nothing
