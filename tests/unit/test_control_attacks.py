"""The control channel under hostile input (issue 30): on a shared cluster the supervisor's port is
reachable by every user, and a rank's code may send anything. Each payload here broke the channel
once (the serving thread died, or a message crashed the supervisor or changed the job's outcome).
Every test drives the real server on 127.0.0.1; tests/e2e/test_control_attacks_job.py attacks a
real running job."""

import json
import os
import resource
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from control_helpers import address, connect, serving, wait_until
from hostile_input import KILLER_LINES, closed_by_server
from launcher import channel
from launcher import environment
from launcher.rank import channel as rank_channel
from launcher.supervisor import channel as supervisor_channel
from launcher.rundir import RunDirectory


@pytest.fixture
def server(tmp_path):
    with serving(tmp_path, size=2) as server:
        yield server


def assert_still_serving(server, rank=1):
    """The serving thread is alive, and a real rank's message still arrives."""
    assert server._thread.is_alive()
    client = connect(server, rank)
    try:
        client.send("abort", {"host": "h", "reason": "collective_timeout", "message": "m", "time": time.time()})
        wait_until(lambda: any(r["rank"] == rank for r in server.abort_requests()))
    finally:
        client.close(linger=0.1)


@pytest.mark.parametrize("payload", KILLER_LINES.values(), ids=KILLER_LINES.keys())
def test_a_bad_first_line_drops_that_connection_not_the_channel(server, payload):
    with socket.create_connection(address(server), timeout=5) as intruder:
        intruder.sendall(payload)
        assert closed_by_server(intruder)
    assert_still_serving(server)
    assert server.refused >= 1


def test_the_same_lines_after_a_hello_drop_the_message_not_the_rank(server):
    rank0 = connect(server, 0)
    for payload in KILLER_LINES.values():
        rank0.sock.sendall(payload if payload.endswith(b"\n") else payload + b"\n")
    rank0.send("done", {"collectives": 3, "time": time.time()})
    wait_until(lambda: [d["rank"] for d in server.done()] == [0])
    assert server._thread.is_alive() and rank0.lost is None
    rank0.close(linger=0.1)


@pytest.mark.parametrize("rank", [-1, "1", 1.7, 10 ** 300, True, 2, None])
def test_a_hello_must_name_one_of_the_jobs_ranks(server, rank):
    """It used to take any rank: -1, "1", 1.7 and 10**300 were accepted."""
    token = server.env()[environment.CONTROL_TOKEN_ENV]
    with socket.create_connection(address(server), timeout=5) as sock:
        sock.sendall(json.dumps({"kind": "hello", "rank": rank, "token": token}).encode() + b"\n")
        assert closed_by_server(sock)
    assert server.connected() == 0
    assert_still_serving(server, 0)


def test_a_second_connection_cannot_speak_for_a_connected_rank(server):
    """A forged message from a connection claiming rank 1 (say, to overwrite its state file or
    mark it done) is refused while rank 1 is connected."""
    rank1 = connect(server, 1)
    wait_until(lambda: server.connected() == 1)
    forger = connect(server, 1)
    forger.send("done", {"collectives": 0, "time": time.time()})
    forger.send("state", {"time": time.time(), "reason": "forged", "where": "nowhere"})
    assert forger.receive(2.0) == [] and forger.lost
    rank1.send("state", {"time": time.time(), "reason": "stop", "where": "job.py:3 in f"})
    wait_until(lambda: server.rank_states())
    assert server.done() == [] and [s["where"] for s in server.rank_states()] == ["job.py:3 in f"]
    rank1.close(linger=0.1)


WRONG_MESSAGES = {
    "abort without time": ("abort", {"host": "h", "reason": "collective_timeout", "message": "m"}),
    "abort for a reason ranks do not give": ("abort", {"reason": "timeout", "message": "m", "time": 1.0}),
    "abort with a string time": ("abort", {"reason": "collective_timeout", "message": "m", "time": "now"}),
    "waiting with a string seq": ("waiting", {"seq": "2", "name": "allreduce", "since": 1.0}),
    "done with a float count": ("done", {"collectives": 1.5, "time": 1.0}),
    "done stopped by numbers": ("done", {"collectives": 1, "time": 1.0, "stopped": {"sources": [1, 2]}}),
    "notice sources not strings": ("notice", {"sources": [{"a": 1}], "time": 1.0}),
    "state without time": ("state", {"reason": "stop"}),
    "progress reports not objects": ("progress", {"reports": [1, 2]}),
    "progress arrivals not numbers": ("progress", {"arrivals": {"first": 1, "times": ["a"]}}),
    "progress arrivals from a float": ("progress", {"arrivals": {"first": 1.5, "times": [1.0]}}),
    "unknown kind": ("reboot", {}),
}


@pytest.mark.parametrize("kind, body", WRONG_MESSAGES.values(), ids=WRONG_MESSAGES.keys())
def test_a_well_formed_but_wrong_message_is_refused_and_changes_nothing(server, kind, body):
    """`abort` without a `time` crashed the supervisor itself (KeyError in _why_stop) and left
    status.json at RUNNING."""
    rank0 = connect(server, 0)
    rank0.send(kind, body)
    wait_until(lambda: server.refused == 1)
    records = {kind: getattr(server, kind)() for kind in ("done", "abort_requests", "notices", "rank_states",
                                                          "waiting", "started")}
    assert all(value == [] for value in records.values()), records
    assert not server.run.metrics_file.exists()
    assert [e["event"] for e in server.run.read_events()] == ["control_refused"]
    assert_still_serving(server)
    rank0.close(linger=0.1)


def test_strangers_cost_the_supervisor_no_memory(tmp_path):
    """300 connections without a hello, each sending 1 MiB: the supervisor went from 27 to 377 MiB
    and kept 339 MiB after they closed. Measured on a server in a process of its own."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from launcher import channel
        from launcher import environment
        from launcher.rank import channel as rank_channel
        from launcher.supervisor import channel as supervisor_channel
        from launcher.rundir import RunDirectory
        run = RunDirectory({str(tmp_path / 'run')!r}); run.logs.mkdir(parents=True)
        server = supervisor_channel.ControlServer(run, size=2).start()
        print(server.address, flush=True)
        time.sleep(120)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        host, _, port = process.stdout.readline().strip().rpartition(":")

        def rss_mib():
            for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

        quiet = rss_mib()
        chunk = b"x" * (1 << 20)
        peak = quiet
        for _ in range(3):  # 3 x 100 connections, as many at once as a 1,024 file limit allows
            socks = []
            for _ in range(100):
                sock = socket.create_connection((host, int(port)), timeout=5)
                sock.setblocking(False)
                try:
                    sock.send(chunk)
                except OSError:
                    pass
                socks.append(sock)
            time.sleep(0.5)
            peak = max(peak, rss_mib())
            for sock in socks:
                sock.close()
        time.sleep(0.5)
        assert peak - quiet < 50, (quiet, peak)
        assert rss_mib() - quiet < 50
    finally:
        process.kill()
        process.wait()


def test_accept_failing_for_want_of_file_descriptors_backs_off_and_goes_on(tmp_path):
    """accept() failing with EMFILE raised out of the serving thread: the job lost its channel."""
    script = textwrap.dedent(f"""
        import os, resource, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from launcher import channel
        from launcher import environment
        from launcher.rank import channel as rank_channel
        from launcher.supervisor import channel as supervisor_channel
        from launcher.rundir import RunDirectory
        run = RunDirectory({str(tmp_path / 'run')!r}); run.logs.mkdir(parents=True)
        server = supervisor_channel.ControlServer(run, size=2).start()
        print(server.address, server.token, flush=True)
        open_now = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        deadline = time.monotonic() + 60
        while not server.abort_requests() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("alive" if server._thread.is_alive() else "dead", len(server.abort_requests()), flush=True)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        where, token = process.stdout.readline().split()
        host, _, port = where.rpartition(":")
        time.sleep(0.5)  # the limit is in place
        crowd = [socket.create_connection((host, int(port)), timeout=5) for _ in range(10)]  # EMFILE past 3
        time.sleep(1.0)
        for sock in crowd:
            sock.close()
        client = rank_channel.ControlClient.connect(where, token, 1, timeout=20)
        client.send("abort", {"host": "h", "reason": "collective_timeout", "message": "m", "time": time.time()})
        out, _ = process.communicate(timeout=60)
        assert out.split() == ["alive", "1"]
        client.close(linger=0.1)
    finally:
        process.kill()
        process.wait()


# --- a fuzzer over message shapes and bytes, against the real server ---------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
FIELD_NAMES = st.sampled_from(["rank", "token", "time", "host", "pid", "seq", "name", "since", "reason", "message",
                               "collectives", "stopped", "sources", "reports", "arrivals", "first", "times",
                               "step", "metrics", "collective", "culprit", "where", "waiting_in"])
MESSAGES = st.builds(
    lambda kind, fields: {"kind": kind, **fields},
    st.sampled_from([*channel.MESSAGE_FIELDS, "hello", "stop", "preempt", ""]) | st.text(max_size=10),
    st.dictionaries(FIELD_NAMES | st.text(max_size=6), JSON_VALUES, max_size=6))
LINES = (MESSAGES.map(lambda m: json.dumps(m).encode() + b"\n")
         | st.binary(max_size=300).map(lambda b: b + b"\n"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINES, min_size=1, max_size=5), hello_first=st.booleans())
def test_fuzzed_messages_never_stop_the_channel(server, lines, hello_first):
    token = server.env()[environment.CONTROL_TOKEN_ENV]
    with socket.create_connection(address(server), timeout=5) as sock:
        if hello_first:
            sock.sendall(json.dumps({"kind": "hello", "rank": 0, "token": token}).encode() + b"\n")
        for line in lines:
            try:
                sock.sendall(line)
            except OSError:
                break  # dropped (before its hello): that is the point
    wait_until(lambda: server.connected() == 0)
    assert server._thread.is_alive()
    with server._lock:  # whatever was taken has the fields the supervisor reads
        for kind, records in server._records.items():
            for record in records.values():
                channel.check_rank_message(kind, {k: v for k, v in record.items() if k != "rank"})
    assert_still_serving(server, 1)
    with server._lock:
        for records in server._records.values():
            records.clear()


def test_a_supervisor_holds_no_socket_before_its_first_attempt(tmp_path):
    """Supervisor.__init__ bound a second listener that was never served nor closed (issue 30, 7)."""
    from launcher.spec import JobSpec
    from launcher.supervisor.supervise import Supervisor

    def sockets():
        return sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") for fd in os.listdir("/proc/self/fd")
                   if os.path.exists(f"/proc/self/fd/{fd}"))

    spec = JobSpec(name="units", entrypoint="job.py:main", processes_per_node=2)
    run = RunDirectory.create(spec, tmp_path / "run")
    before = sockets()
    supervisors = [Supervisor(spec, run, [], {}) for _ in range(5)]
    assert sockets() == before and all(s.channel is None for s in supervisors)
    server = supervisor_channel.ControlServer(run, size=2).start()
    assert sockets() == before + 3  # the listener and the wake-up pair, while it serves
    server.close()
    assert sockets() == before


class _Comm:
    """A communicator of `size` processes as rank 0 sees it, on the given hosts."""

    def __init__(self, hosts):
        self.hosts = hosts

    def Get_rank(self):
        return 0

    def Get_size(self):
        return len(self.hosts)

    def bcast(self, value, root=0):
        return value

    def allgather(self, value):
        return [value, *self.hosts[1:]]


def _coordinator_of(comm, monkeypatch, bind_env=None):
    from launcher.rank.jax_runtime import coordinator_address, start_jax_distributed

    calls = []

    class FakeJax:
        class config:
            update = staticmethod(lambda *args: None)

        class distributed:
            initialize = staticmethod(lambda **kwargs: calls.append(kwargs))

    if bind_env is None:
        monkeypatch.delenv("JAX_COORDINATOR_BIND_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("JAX_COORDINATOR_BIND_ADDRESS", bind_env)
    start_jax_distributed(FakeJax, coordinator_address(comm), comm.Get_size(), comm.Get_rank(), "cpu", 60)
    return calls[0]


def test_jax_coordination_service_listens_where_the_ranks_reach_it_not_on_every_interface(monkeypatch):
    """jax_distributed: true left JAX's unauthenticated coordinator on [::]:port (issue 30, 5)."""
    here = socket.gethostname()
    one_host = _coordinator_of(_Comm([here, here]), monkeypatch)
    assert one_host["coordinator_address"].startswith("127.0.0.1:")
    assert one_host["coordinator_bind_address"] == one_host["coordinator_address"]
    several = _coordinator_of(_Comm([here, "another-node"]), monkeypatch)
    host = several["coordinator_bind_address"].rpartition(":")[0]
    assert host == socket.gethostbyname(here) and not host.startswith(("[::]", "0.0.0.0"))
    assert several["coordinator_bind_address"] == several["coordinator_address"]
    chosen = _coordinator_of(_Comm([here, here]), monkeypatch, bind_env="10.1.2.3:4567")
    assert chosen["coordinator_bind_address"] == "10.1.2.3:4567"  # the user's own choice wins
