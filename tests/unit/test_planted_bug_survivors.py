"""Behaviours that an audit of planted bugs found uncovered (issue 44): for each, a small bug planted by
hand in the code went unnoticed by the whole unit tier. Each test here passes on the code as it is and
fails with the bug its docstring names planted."""

import json
import os
import socket
import sys
import time

import pytest
from control_helpers import connect, serving, wait_until
from test_drill_units import killed, write_run  # the drill tests' run directory, written by hand

from launcher import channel
from launcher.backends.slurm.allocation import SlurmAllocation
from launcher.errors import UsageError
from launcher.rank.jax_runtime import InitializeAnswer
from launcher.rank.program import run_program
from launcher.rundir import RunDirectory, make_private_dir
from launcher.spec import JobSpec
from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_STEP_FACTOR, SlurmSpec
from launcher.states import JobState
from launcher.supervisor import rollcall
from launcher.supervisor.watchdog import HangWatchdog


# --- a module entrypoint's sys.path (launcher/rank/program.py) ------------------------------------

def test_a_module_program_imports_the_snapshot_before_the_working_directory(tmp_path, monkeypatch):
    """Planted bug: run_program puts the working directory before the snapshot (`code`) on sys.path."""
    name = "jaxlaunch_planted_snapshot_first"
    marker = tmp_path / "ran.txt"
    snapshot, cwd = tmp_path / "snapshot", tmp_path / "cwd"
    for folder in (snapshot, cwd):
        folder.mkdir()
        (folder / f"{name}.py").write_text(f"import pathlib, sys\n"
                                           f"pathlib.Path({str(marker)!r}).write_text({folder.name!r} + ' ' + "
                                           f"' '.join(sys.argv[1:]))\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.chdir(cwd)
    run_program(name, "module", ["--steps", "3"], code=snapshot)
    assert marker.read_text() == "snapshot --steps 3"  # the snapshot's copy ran, not the working directory's
    assert sys.path.index(str(snapshot)) < sys.path.index(str(cwd))


# --- jax.distributed.initialize's arguments (launcher/rank/jax_runtime.py) --------------------------

def test_arguments_a_program_passes_as_none_are_still_filled_in_by_jaxlaunch(monkeypatch):
    """Planted bug: `if filled.get(key) is None:` becomes `if key not in filled:`, so an argument given
    explicitly as None (what `os.environ.get(...)` gives off a TPU pod) reaches JAX as None."""
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    answer = InitializeAnswer("10.0.0.1:4321", 4, 2, "cpu", 30, started_by_jaxlaunch=False, jax_started=lambda: False)
    filled = answer.arguments({"coordinator_address": None, "num_processes": None, "process_id": None})
    assert (filled["coordinator_address"], filled["num_processes"], filled["process_id"]) == ("10.0.0.1:4321", 4, 2)
    assert filled["coordinator_bind_address"] == "10.0.0.1:4321"
    assert answer.arguments({"process_id": 1})["process_id"] == 1  # one the program gives still wins


# --- the hang watchdog's auto limit (launcher/supervisor/watchdog.py) -------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_auto_learns_a_slow_step_from_report_times_alone_without_step_seconds():
    """Planted bug: the loop that raises slowest_step from the gaps between a rank's report times is
    removed (step_seconds is still read): a job whose reports carry no step_seconds keeps the floor."""
    clock = Clock()
    dog = HangWatchdog("auto", clock)
    dog.progress(0, {"step": 1, "time": 10.0, "total": None})  # no step_seconds, no reports list
    dog.progress(0, {"step": 2, "time": 100.0, "total": None})
    assert dog.limit() == HANG_STEP_FACTOR * 90.0  # the 90 s between the two reports
    dog.progress(1, {"step": 3, "total": None, "reports": [{"step": 2, "time": 5.0, "metrics": {}},
                                                           {"step": 3, "time": 205.0, "metrics": {}}]})
    assert dog.limit() == HANG_STEP_FACTOR * 200.0 > HANG_FLOOR_SECONDS
    clock.now += HANG_FLOOR_SECONDS + 1  # past the floor, within the learned limit: no hang yet
    assert dog.check() is None


# --- the roll-call names a silent rank's node (launcher/supervisor/rollcall.py) ----------------------

def test_a_rank_that_did_not_answer_is_named_with_its_node_from_hosts():
    """Planted bug: `or hosts.get(rank)` is dropped: a rank with no state record gets no node, and a
    requeue or spare swap keeps the node that held the job up."""
    states = [{"rank": 0, "host": "n0", "where": "/a/t.py:5 in main",
               "place": {"kind": "xla", "where": "/a/t.py:5 in main", "detail": "step"}}]
    roll = rollcall.roll_call(2, states, hosts={0: "n0", 1: "n1"})
    assert [(c["rank"], c["host"]) for c in roll["culprits"]] == [(1, "n1")]
    assert "rank 1 on n1 did not answer" in roll["line"]
    assert list(rollcall.culprit_nodes(roll)) == ["n1"]


# --- a requeue that leaves nodes behind (launcher/backends/slurm/allocation.py) ---------------------

@pytest.fixture
def slurm_partition(fake_slurm):
    """No Slurm: the job's record says partition `debug`, whose nodes are `members` (set by the test)."""
    members = []
    fake_slurm.answers.update({
        "scontrol show job": "JobId=7 JobState=RUNNING Partition=debug\n",
        "scontrol show partition": "PartitionName=debug\n",
        "scontrol show node": lambda argv: "".join(f"NodeName={n} Partitions=debug\n" for n in members)})
    return members


def slurm_run(tmp_path, **slurm_fields):
    spec = JobSpec(name="units", entrypoint="job.py:main", nodes=2, processes_per_node=1,
                   slurm=SlurmSpec(**{"max_requeues": 2, **slurm_fields}))
    return spec, RunDirectory.create(spec, tmp_path / "run")


def test_the_room_check_before_leaving_nodes_behind_counts_the_spare_nodes(tmp_path, slurm_partition):
    """Planted bug: the nodes a requeue needs are the job's nodes only, without slurm.spare_nodes: a
    requeue that would wait in the queue for good is allowed."""
    spec, run = slurm_run(tmp_path, spare_nodes=1)
    echoed = []
    allocation = SlurmAllocation("7").bind(spec, run, echoed.append)
    slurm_partition[:] = ["node1", "node2", "node3", "node4"]
    assert allocation.can_leave_nodes_behind({"node1"})  # 3 left: 2 nodes + 1 spare
    slurm_partition[:] = ["node1", "node2", "node3"]
    assert not allocation.can_leave_nodes_behind({"node1"})  # 2 left, the job needs 3
    state, failure = allocation.leave_nodes_behind({"node1": "held the job up"}, "hang", None, 0)
    assert state == JobState.FAILED and "fewer than the job's 3" in failure["summary"], failure


def test_a_requeue_after_a_hang_is_counted_apart_from_node_failures(tmp_path, slurm_partition):
    """Planted bug: a hang's requeue is counted in status.json's node_failures, not hang_requeues."""
    spec, run = slurm_run(tmp_path)
    slurm_partition[:] = ["node1", "node2", "node3", "node4"]
    allocation = SlurmAllocation("7").bind(spec, run, lambda line: None)
    state, _ = allocation.leave_nodes_behind({"node2": "rank 1 held the job up"}, "hang", None, 0)
    assert state == JobState.REQUEUED
    status = run.read_status()
    assert (status["requeues"], status["hang_requeues"], status.get("node_failures", 0)) == (1, 1, 0)
    state, _ = allocation.leave_nodes_behind({"node3": "State=DOWN"}, "node_failure", None, 1)
    status = run.read_status()
    assert (state, status["requeues"], status["hang_requeues"], status["node_failures"]) == \
        (JobState.REQUEUED, 2, 1, 1)


# --- the drill's score (launcher/cli/drill_trials/) ----------------------------------------------------------

def make_drill(tmp_path, checkpoints=(4, 8)):
    from launcher.cli import drill_trials as drills

    drill = drills.Drill("job.yaml", [], [], tmp_path, ["kill", "preempt", "hang"], 2, seed=7, tolerance=0.0)
    drill.clean = {"run_dir": str(tmp_path / "clean"), "state": "COMPLETED", "seconds": 10.0, "steps": list(range(10)),
                   "checkpoints": list(checkpoints), "checkpoint_interval": 4 if checkpoints else None,
                   "slowest_step": 0.1}
    return drill


def killed_and_restored(tmp_path, name, last_step, ended="FAILED"):
    """A kill trial: attempt 0 reported steps 0..last_step and ended `ended`; attempt 1 restored step 4."""
    from launcher.cli import drill_trials as drills

    trial = drills.Trial("kill", "step", 1, target_step=last_step, injected_at=100.0, run_dir=str(tmp_path / name))
    events = [{"event": "attempt_started", "attempt": 0, "time": 90.0},
              {"event": "attempt_ended", "attempt": 0, "state": ended, "time": 101.5},
              {"event": "attempt_started", "attempt": 1, "time": 101.6},
              {"event": "restored", "step": 4, "time": 104.0}, {"event": "attempt_ended", "attempt": 1, "time": 110.0}]
    reports = [{"step": s, "time": 95.0 + s * 0.5} for s in range(last_step + 1)] + \
              [{"step": s, "time": 105.0 + s * 0.1} for s in range(4, 10)]
    write_run(tmp_path / name, events, reports, result={"loss": 1.0}, failures=[killed(attempt=0, rank=1)])
    return trial


def test_losing_exactly_the_checkpoint_interval_passes_and_one_step_more_fails(tmp_path):
    """Planted bug: `steps_lost > interval` becomes `>=`: a run that lost exactly its checkpoint
    interval (the most a checkpoint every 4 steps can lose) fails the drill."""
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [], result={"loss": 1.0})
    exact = killed_and_restored(tmp_path, "kill-exact", last_step=7)  # steps 4-7 computed again
    drill.score(exact, tmp_path / "kill-exact")
    assert exact.steps_lost == 4 and exact.passed, exact.why
    more = killed_and_restored(tmp_path, "kill-more", last_step=8)  # steps 4-8
    drill.score(more, tmp_path / "kill-more")
    assert more.steps_lost == 5 and not more.passed
    assert any("more than its checkpoint interval (4 steps)" in why for why in more.why), more.why


def test_a_kill_whose_attempt_still_ended_completed_was_not_detected(tmp_path):
    """Planted bug: an attempt that ended COMPLETED counts as the fault detected (only None is not)."""
    drill = make_drill(tmp_path)
    write_run(tmp_path / "clean", [], [], result={"loss": 1.0})
    trial = killed_and_restored(tmp_path, "kill-missed", last_step=5, ended="COMPLETED")
    drill.score(trial, tmp_path / "kill-missed")
    assert trial.faulted_state == "COMPLETED" and not trial.detected and not trial.passed
    assert any("the kill was not detected: the attempt it hit ended COMPLETED" in why for why in trial.why), trial.why


# --- collectives inside the job's own jit (launcher/rank/collectives/traced.py) ---------------------

def test_a_jitted_tree_of_tracers_and_a_python_constant_takes_the_in_jit_path():
    """Planted bug: is_traced asks that every leaf be a tracer (all, not any): a tree such as
    {"g": grads, "n": 1} inside jax.jit would go to the outside-jit path and fail on a tracer."""
    import jax
    import jax.numpy as jnp

    from launcher.rank.collectives import traced

    answers = []

    @jax.jit
    def step(g):
        answers.append(traced.is_traced(jax.tree_util.tree_leaves({"g": g, "n": 1})))
        answers.append(traced.is_traced(jax.tree_util.tree_leaves({"g": g, "h": g * 2})))
        return g

    step(jnp.ones(2))
    assert answers == [True, True]
    assert not traced.is_traced(jax.tree_util.tree_leaves({"g": jnp.ones(2), "n": 1}))  # outside jit


# --- the control channel (launcher/channel.py, launcher/supervisor/channel.py) ----------------------

def test_a_notice_whose_sources_mix_strings_and_other_values_is_refused():
    """Planted bug: check_rank_message asks that any source be a string (any, not all)."""
    channel.check_rank_message("notice", {"sources": ["SIGUSR2"], "time": 1.0})
    with pytest.raises(channel.BadMessage, match="notice: sources must be strings"):
        channel.check_rank_message("notice", {"sources": ["SIGUSR2", 3], "time": 1.0})


@pytest.fixture
def server(tmp_path):
    with serving(tmp_path, size=2) as server:
        yield server


def test_stop_and_preempt_go_only_to_connections_that_said_hello(server):
    """Planted bug: _send_to_every_rank drops its `connection.rank is not None` check: a stranger that
    connected to the port, and has not said hello, hears every stop and preemption notice."""
    host, _, port = server.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as stranger:
        rank0 = connect(server, 0)
        try:
            wait_until(lambda: server.connected() == 1 and len(server._connections) == 2)  # both accepted
            server.send_preempt_notice(channel.PreemptNotice("SIGUSR2", 5.0))
            server.request_stop(channel.StopRequest("timeout", 6.0, detail="d"))
            kinds = []
            deadline = time.monotonic() + 5
            while len(kinds) < 2 and time.monotonic() < deadline:
                kinds += [m["kind"] for m in rank0.receive(0.2)]
            assert kinds == ["preempt", "stop"]
            assert len(server._connections) == 2  # the stranger is still connected (within its hello time)
            stranger.settimeout(0.3)
            with pytest.raises(socket.timeout):
                heard = stranger.recv(100)
                pytest.fail(f"the stranger heard {heard!r}")
        finally:
            rank0.close(linger=0.1)


# --- the run directory's folder (launcher/rundir/__init__.py) ---------------------------------------

def test_an_existing_run_directory_its_group_can_write_is_refused(tmp_path):
    """Planted bug: the mask 0o022 becomes 0o002: only a folder everybody can write is refused, and
    one the group can write (0o775) is taken."""
    folder = tmp_path / "run"
    folder.mkdir()
    os.chmod(folder, 0o775)
    with pytest.raises(UsageError, match="can be written by other users .mode 775."):
        make_private_dir(folder)
    os.chmod(folder, 0o755)
    make_private_dir(folder)  # writable by us alone: taken
