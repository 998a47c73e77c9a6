"""The control channel's tests' shared pieces (tests/unit/test_control_*.py and the planted-bug
audit): a real ControlServer on 127.0.0.1 over a fresh run directory, a rank's client connected to
it as a rank connects, and a bounded wait for what the serving thread does."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from launcher import environment
from launcher.rank import channel as rank_channel
from launcher.rundir import RunDirectory
from launcher.supervisor import channel as supervisor_channel


@contextlib.contextmanager
def serving(tmp_path: Path, size: int = 0):
    """A started ControlServer for a job of `size` ranks (0: not told), closed after."""
    run = RunDirectory(tmp_path / "run")
    run.logs.mkdir(parents=True)
    with supervisor_channel.ControlServer(run, size=size) as server:
        yield server


def address(server) -> tuple[str, int]:
    host, _, port = server.address.rpartition(":")
    return host, int(port)


def connect(server, rank: int):
    """Rank `rank`'s client, connected with the address and secret the server gives its ranks."""
    env = server.env()
    return rank_channel.ControlClient.connect(env[environment.CONTROL_ENV], env[environment.CONTROL_TOKEN_ENV], rank)


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
