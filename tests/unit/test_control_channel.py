"""The control channel (launcher/control.py) on real sockets, and what it promises a real job: no
filesystem polling by an idle rank, the supervisor told of a rank's event at once, ranks that stop
when their supervisor dies."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TEST_JOBS
from launcher import control
from launcher.rundir import RunDirectory
from launcher.supervisor.processes import job_processes
from supervision_helpers import rank_pid, wait_for_file

SPEC = TEST_JOBS / "misbehave.yaml"
JAXLAUNCH = str(Path(sys.executable).parent / "jaxlaunch")


@pytest.fixture
def server(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.logs.mkdir(parents=True)
    with control.ControlServer(run) as server:
        yield server


def connect(server, rank):
    env = server.env()
    return control.ControlClient.connect(env[control.CONTROL_ENV], env[control.CONTROL_TOKEN_ENV], rank)


def wait_until(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_rank_event_reaches_the_supervisor_at_once(server):
    client = connect(server, 3)
    server.changed.clear()
    sent = time.monotonic()
    client.send("abort", {"host": "h", "reason": "collective_timeout", "message": "m", "time": time.time()})
    assert server.changed.wait(0.5)
    took = time.monotonic() - sent
    assert [(r["rank"], r["reason"]) for r in server.abort_requests()] == [(3, "collective_timeout")]
    assert took < 0.5  # the bound; ~1 ms on loopback


def test_a_connection_without_the_secret_is_dropped_and_heard_nothing(server):
    host, _, port = server.address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as intruder:
        intruder.sendall(control.encode("hello", {"rank": 0, "token": "guess"}))
        intruder.sendall(control.encode("abort", {"reason": "x", "message": "y", "time": 1.0}))
        try:
            heard = intruder.recv(100)
        except ConnectionResetError:  # closed with our abort unread: a reset
            heard = b""
        assert heard == b""  # closed on us
    server.request_stop(control.StopRequest("timeout", 1.0))
    assert server.abort_requests() == [] and server.connected() == 0


def test_a_rank_speaks_only_for_itself_and_its_first_abort_counts(server):
    client = connect(server, 1)
    client.send("done", {"rank": 7, "collectives": 4, "time": 1.0, "stopped": None})
    client.send("abort", {"reason": "collective_timeout", "message": "first", "time": 1.0})
    client.send("abort", {"reason": "collective_timeout", "message": "second", "time": 2.0})
    wait_until(lambda: server.done() and server.abort_requests())
    time.sleep(0.1)
    assert [d["rank"] for d in server.done()] == [1]
    assert [a["message"] for a in server.abort_requests()] == ["first"]


def test_stop_and_notice_reach_every_rank_and_a_rank_that_connects_later(server):
    early = connect(server, 0)
    wait_until(lambda: server.connected() == 1)
    server.send_preempt_notice(control.PreemptNotice("SIGUSR2", 5.0))
    server.request_stop(control.StopRequest("timeout", 6.0, detail="d"))
    late = connect(server, 1)
    for client in (early, late):
        kinds = []
        deadline = time.monotonic() + 5
        while len(kinds) < 2 and time.monotonic() < deadline:
            kinds += [m["kind"] for m in client.receive(0.2)]
        assert kinds == ["preempt", "stop"]


def test_a_state_answer_is_kept_for_people_in_the_run_directory(server):
    client = connect(server, 2)
    client.send("state", {"reason": "timeout", "time": 1.0, "where": "job.py:3 in main"})
    wait_until(lambda: server.rank_states())
    state = json.loads(server.run.rank_state(2).read_text())
    assert state["rank"] == 2 and state["where"] == "job.py:3 in main"
    server.save_records()
    records = json.loads(server.run.control_records.read_text())
    assert records["state"][0]["rank"] == 2 and records["done"] == []


def test_a_rank_sees_its_supervisor_go_within_half_a_second(tmp_path):
    run = RunDirectory(tmp_path / "run")
    run.logs.mkdir(parents=True)
    server = control.ControlServer(run).start()
    client = connect(server, 0)
    wait_until(lambda: server.connected() == 1)
    server.close()
    gone = time.monotonic()
    while not client.lost:
        client.receive(0.05)
        assert time.monotonic() - gone < 0.5
    assert "closed" in client.lost


def test_a_rank_that_cannot_reach_the_supervisor_is_told_how_to_fix_it():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(control.ControlLost, match="JAXLAUNCH_CONTROL_HOST"):
        control.ControlClient.connect(f"127.0.0.1:{port}", "t", 0, timeout=0.3)


def test_the_supervisor_binds_where_it_is_told():
    assert control.control_host({}) == "127.0.0.1"
    assert control.control_host({control.CONTROL_HOST_ENV: "10.1.2.3"}) == "10.1.2.3"


# --- a real job ------------------------------------------------------------------------------------

def strace_file_calls(pid: int, seconds: float, out: Path) -> list[str]:
    """Every syscall that names a file, made by `pid` (all its threads) during `seconds`."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(out), "-p", str(pid)],
                              stderr=subprocess.PIPE)
    time.sleep(seconds)
    tracer.send_signal(signal.SIGINT)
    _, err = tracer.communicate(timeout=10)
    if "Operation not permitted" in err.decode():
        pytest.skip(f"strace may not attach here: {err.decode().strip()}")
    return out.read_text().splitlines() if out.exists() else []


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_an_idle_rank_makes_no_filesystem_calls_on_the_run_directory(tmp_path):
    """The issue's bound: 0 metadata operations on the run directory by an idle rank in 10 s (the file
    channel this replaced made ~100: stop.json and preempt.json, 5 times a second). Rank 1 sleeps in
    main, rank 0 waits for it in an allreduce."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(SPEC), "--run-dir", str(run_dir),
                                "--set", "params.how=hang", "--set", "params.seconds=40"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_file(run_dir / "ready-rank-1", 90, process)
        time.sleep(1.5)  # past the wait report of rank 0's collective
        calls = {rank: strace_file_calls(rank_pid(run_dir, rank), 10, tmp_path / f"strace-{rank}.txt")
                 for rank in (0, 1)}
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    for rank, lines in calls.items():
        on_run_dir = [line for line in lines if str(run_dir) in line]
        assert on_run_dir == [], f"rank {rank} touched the run directory: {on_run_dir[:5]}"


def test_ranks_stop_soon_after_their_supervisor_is_killed(tmp_path):
    """kill -9 of `jaxlaunch run` leaves mpirun and the ranks (they run in a session of their own):
    they see the connection end, and are gone within ORPHAN_EXIT_SECONDS and a few seconds more."""
    from launcher.rank.monitor import ORPHAN_EXIT_SECONDS

    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(SPEC), "--run-dir", str(run_dir),
                                "--set", "params.how=hang", "--set", "params.seconds=120"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_file(run_dir / "ready-rank-1", 90, process)
        assert job_processes(run_dir)
        process.kill()
        process.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + ORPHAN_EXIT_SECONDS + 20
        while job_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = job_processes(run_dir)
    finally:
        for pid in job_processes(run_dir):
            os.kill(pid, signal.SIGKILL)
    assert left == [], "the job ran on without its supervisor"
    logs = "".join((run_dir / "logs" / f"rank-{r}.log").read_text() for r in (0, 1))
    assert "lost its supervisor (the supervisor closed the connection)" in logs
