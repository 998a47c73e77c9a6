"""`run` and `submit` share one start path over any backend (launcher/cli/start_job.py): a scripted
backend shows which of its methods each command calls, and what each prints and exits with."""

import json
import os
import signal
import types

import pytest

from launcher.backends.base import Backend, Plan
from launcher.states import JobState

from cli_helpers import invoke


class ScriptedPlan(Plan):
    def describe(self):
        return f"the scripted plan of {self.subject.name}\n"


class ScriptedHandle:
    def __init__(self, run_dir, state=JobState.COMPLETED, interrupted=False):
        self.id, self.run_dir, self.warnings = "s-1", run_dir, ["a warning of the backend's"]
        self.run = types.SimpleNamespace(path=run_dir)
        self.final, self.interrupted, self.cancelled = state, interrupted, False

    def wait(self, on_change=None, **_):
        if self.interrupted == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)
        if self.interrupted:
            raise KeyboardInterrupt
        on_change(self, JobState.RUNNING)
        on_change(self, self.final)
        return self.final

    def pending_reason(self):
        return ""

    def failure_lines(self):
        return ["FAILED: rank 1 failed first: boom"]

    def exit_code(self):
        return 0 if self.final == JobState.COMPLETED else 3

    def cancel(self):
        self.cancelled = True


class ScriptedBackend(Backend):
    """Starts nothing: records which start it was asked for; `here` makes it a backend that runs
    jobs in this process (as the local one does)."""

    name = "scripted"

    def __init__(self, tmp_path, here=False, **handle):
        self.tmp_path, self.here, self.calls = tmp_path, here, []
        self.handle = ScriptedHandle(tmp_path / "run", **handle)

    def plan(self, spec_or_sweep, run_dir=None, max_parallel=None):
        return ScriptedPlan(spec_or_sweep, run_dir or self.tmp_path / "run", run_dir)

    def start_plan(self, plan, files=None, **options):
        self.calls.append(("start_plan", options))
        (self.tmp_path / "run").mkdir(exist_ok=True)
        (self.tmp_path / "run" / "result.json").write_text(json.dumps({"value": 1}))
        return self.handle

    def run_in_foreground(self, plan, echo=print, print_result=print):
        if not self.here:
            return None
        self.calls.append(("run_in_foreground", plan.subject.name))
        return self.handle

    def start_sweep(self, sweep, run_dir=None, max_parallel=None, echo=print, **options):
        self.calls.append(("start_sweep", options))
        return types.SimpleNamespace(path=self.tmp_path / "sweep"), ["s_1", "s_2"]

    def wait_for_sweep(self, directory, echo, poll_seconds=2.0):
        raise KeyboardInterrupt

    def find_to_cancel(self, ref):
        return types.SimpleNamespace(cancel=lambda: self.calls.append(("cancel", ref)))

    def find(self, ref):
        raise NotImplementedError

    def find_all(self):
        return []


@pytest.fixture
def scripted(monkeypatch, tmp_path, write_spec):
    """`jaxlaunch run|submit SPEC --backend scripted` reaching a ScriptedBackend made by `make(**kw)`."""
    made = {}

    def make(**kw):
        made["backend"] = ScriptedBackend(tmp_path, **kw)
        return made["backend"]

    monkeypatch.setattr("launcher.backends.get_backend", lambda name: made["backend"])
    monkeypatch.setattr("launcher.backends.names", lambda: ["local", "slurm", "scripted"])
    monkeypatch.setattr("launcher.supervisor.result_text",
                        lambda run: (run.path / "result.json").read_text() if (run.path / "result.json").exists()
                        else None)
    return make, write_spec("name: j\nentrypoint: m:f\n")


def test_run_on_a_backend_that_runs_jobs_here_runs_it_in_the_foreground(scripted):
    make, spec = scripted
    backend = make(here=True)
    result = invoke("run", spec, "--backend", "scripted")
    assert result.exit_code == 0, result.output
    assert backend.calls == [("run_in_foreground", "j")]


def test_run_elsewhere_starts_the_plan_and_follows_it_with_the_result_on_stdout_and_the_jobs_exit_code(scripted):
    make, spec = scripted
    backend = make()
    result = invoke("run", spec, "--backend", "scripted")
    assert backend.calls == [("start_plan", {"check": True})]
    assert result.exit_code == 0, result.output
    assert result.stdout == '{"value": 1}\n'
    assert "Submitted job s-1; run directory: " in result.stderr and "warning: a warning of the backend's" in result.stderr
    failed = make(state=JobState.FAILED)
    result = invoke("run", spec, "--backend", "scripted")
    assert result.exit_code == 3 and "FAILED: rank 1 failed first: boom" in result.stderr and result.stdout == ""
    assert not failed.handle.cancelled


def test_ctrl_c_while_run_follows_cancels_the_job_and_while_submit_waits_only_stops_following(scripted):
    make, spec = scripted
    followed = make(interrupted=True)
    result = invoke("run", spec, "--backend", "scripted")
    assert result.exit_code == 130 and followed.handle.cancelled
    assert "jaxlaunch: interrupted: cancelling job s-1" in result.stderr
    waited = make(interrupted=True)
    result = invoke("submit", spec, "--backend", "scripted", "--wait")
    assert result.exit_code == 130 and not waited.handle.cancelled
    assert "stopped following job s-1; it goes on (jaxlaunch cancel s-1)" in result.stderr


def test_sigterm_to_a_run_that_follows_its_job_cancels_the_job_as_ctrl_c_does(scripted):
    make, spec = scripted

    def before(signum, frame):  # this test's own: a handler an earlier follow left behind would pass too
        raise AssertionError("the handler the follow replaced was called")

    previous = signal.signal(signal.SIGTERM, before)
    try:
        followed = make(interrupted="SIGTERM")
        result = invoke("run", spec, "--backend", "scripted")
        assert signal.getsignal(signal.SIGTERM) is before  # given back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 143 and followed.handle.cancelled
    assert "jaxlaunch: terminated: cancelling job s-1" in result.stderr


def test_ctrl_c_while_run_follows_a_sweep_cancels_every_array_and_submit_wait_leaves_them(scripted):
    make, spec = scripted
    followed = make()
    result = invoke("run", spec, "--backend", "scripted", "--sweep", "params.a=1,2")
    assert result.exit_code == 130, result.output
    assert followed.calls == [("start_sweep", {"check": True}), ("cancel", "s_1"), ("cancel", "s_2")]
    assert "jaxlaunch: interrupted: cancelling jobs s_1, s_2" in result.stderr
    waited = make()
    result = invoke("submit", spec, "--backend", "scripted", "--sweep", "params.a=1,2", "--wait")
    assert result.exit_code == 130 and waited.calls == [("start_sweep", {"check": True})]
    assert "stopped following jobs s_1, s_2; they go on (jaxlaunch cancel s_1 s_2)" in result.stderr


def test_a_followed_sweep_exits_0_only_when_every_task_completed(scripted, monkeypatch):
    """Issue 55: the exit code of `run --sweep` elsewhere, and of `submit --sweep --wait`."""
    make, spec = scripted
    tables = []
    monkeypatch.setattr("launcher.cli.start_job.print_results_table", tables.append)
    for states, code in (([JobState.COMPLETED, JobState.COMPLETED], 0), ([JobState.COMPLETED, JobState.FAILED], 1),
                         ([JobState.TIMEOUT, JobState.COMPLETED], 1)):
        for command in (["run"], ["submit", "--wait"]):
            backend = make()
            tasks = [types.SimpleNamespace(state=state) for state in states]
            backend.wait_for_sweep = lambda directory, echo, tasks=tasks: tasks
            result = invoke(*command, spec, "--backend", "scripted", "--sweep", "params.a=1,2")
            assert result.exit_code == code, (command, states, result.output)
    assert len(tables) == 6  # the results table each time


def test_submit_without_wait_prints_the_id_on_stdout_and_returns(scripted):
    make, spec = scripted
    backend = make(here=True)  # submit never runs a job in the foreground, even where it could
    result = invoke("submit", spec, "--backend", "scripted", "--parsable", "--no-check")
    assert result.exit_code == 0 and result.stdout == "s-1\n"
    assert backend.calls == [("start_plan", {"check": False})]


def test_dry_run_shows_the_plan_both_commands_would_start(scripted):
    make, spec = scripted
    for command in ("run", "submit"):
        backend = make()
        result = invoke(command, spec, "--backend", "scripted", "--dry-run")
        assert result.exit_code == 0 and result.stdout == "the scripted plan of j\n" and backend.calls == []


def test_a_local_sweep_submitted_to_the_background_is_refused_with_the_command_that_runs_it(write_spec, tmp_path):
    """It was a TypeError traceback (LocalBackend.start_sweep had no `check`)."""
    spec = write_spec("name: j\nentrypoint: m:f\n")
    result = invoke("submit", spec, "--backend", "local", "--sweep", "params.a=1,2", "--run-dir", tmp_path / "sweep")
    assert result.exit_code == 2, result.output
    assert "the local backend runs a sweep here, in the foreground" in result.output
    assert "`jaxlaunch run SPEC --sweep ...`" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "sweep").exists()


def test_the_seams_defaults_run_nothing_here():
    """A backend that starts jobs elsewhere inherits None from both foreground methods."""
    backend = ScriptedBackend.__new__(ScriptedBackend)
    assert Backend.run_in_foreground(backend, None) is None
    assert Backend.run_sweep_in_foreground(backend, None) is None
