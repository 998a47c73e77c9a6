"""The control channel (launcher/channel.py) on real sockets: the supervisor told of a rank's event at
once, a rank told when its supervisor goes. What it promises a real job (no filesystem polling by an
idle rank, ranks that stop when their supervisor dies) is in tests/e2e/test_control_channel_jobs.py."""

import json
import socket
import time

import pytest

from control_helpers import connect, serving, wait_until
from launcher import channel
from launcher import environment
from launcher.rank import channel as rank_channel
from launcher.supervisor import channel as supervisor_channel
from launcher.rundir import RunDirectory


@pytest.fixture
def server(tmp_path):
    with serving(tmp_path) as server:
        yield server


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
        intruder.sendall(channel.encode("hello", {"rank": 0, "token": "guess"}))
        intruder.sendall(channel.encode("abort", {"reason": "x", "message": "y", "time": 1.0}))
        try:
            heard = intruder.recv(100)
        except ConnectionResetError:  # closed with our abort unread: a reset
            heard = b""
        assert heard == b""  # closed on us
    server.request_stop(channel.StopRequest("timeout", 1.0))
    assert server.abort_requests() == [] and server.connected() == 0


def test_a_rank_speaks_only_for_itself_and_its_first_abort_counts(server):
    client = connect(server, 1)
    client.send("done", {"rank": 7, "collectives": 4, "time": 1.0, "stopped": None})
    client.send("abort", {"reason": "collective_timeout", "message": "first", "time": 1.0})
    client.send("abort", {"reason": "collective_timeout", "message": "second", "time": 2.0})
    # One connection's lines are taken in order: once this last one is in, the second abort was too
    # (a fixed sleep here let the asserts below pass before it had been read).
    client.send("state", {"reason": "timeout", "time": 3.0, "where": "after the second abort"})
    wait_until(lambda: server.rank_states(), timeout=30)
    assert [d["rank"] for d in server.done()] == [1]
    assert [a["message"] for a in server.abort_requests()] == ["first"]


def test_stop_and_notice_reach_every_rank_and_a_rank_that_connects_later(server):
    early = connect(server, 0)
    wait_until(lambda: server.connected() == 1)
    server.send_preempt_notice(channel.PreemptNotice("SIGUSR2", 5.0))
    server.request_stop(channel.StopRequest("timeout", 6.0, detail="d"))
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
    server = supervisor_channel.ControlServer(run).start()
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
    with pytest.raises(rank_channel.ControlLost, match="JAXLAUNCH_CONTROL_HOST"):
        rank_channel.ControlClient.connect(f"127.0.0.1:{port}", "t", 0, timeout=0.3)


def test_the_supervisor_binds_where_it_is_told():
    from launcher.backends.base import Allocation
    from launcher.backends.slurm.allocation import SlurmAllocation

    assert Allocation().control_host({}) == "127.0.0.1"
    assert Allocation().control_host({environment.CONTROL_HOST_ENV: "10.1.2.3"}) == "10.1.2.3"
    # in a Slurm job too, the variable wins over asking Slurm for the node's address
    assert SlurmAllocation("7").control_host({environment.CONTROL_HOST_ENV: "10.1.2.3",
                                              "SLURMD_NODENAME": "node1"}) == "10.1.2.3"
