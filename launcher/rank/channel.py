"""A rank's end of the control channel: its one TCP connection to the supervisor (the protocol:
launcher/channel.py). The rank's monitor thread (launcher/rank/monitor.py) owns it: it sends what
the rank did (started, waiting, done, progress...) and receives stop requests and notices. A lost
connection means a lost supervisor: the end of the connection (a killed process) or TCP keepalive
(a dead host) tells, in about 11 s at most.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time

from ..channel import encode
from ..environment import CONTROL_ENV, CONTROL_HOST_ENV, CONTROL_TOKEN_ENV

CONNECT_SECONDS = 60.0      # a rank keeps trying to reach the supervisor this long at start-up
# TCP keepalive on the ranks' side: a supervisor host that died silently is noticed after
# IDLE + INTERVAL * COUNT seconds.
KEEPALIVE = (5, 2, 3)


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class ControlLost(Exception):
    """The supervisor cannot be reached any more (or never could)."""


class ControlClient:
    """A rank's side: its one connection to the supervisor. `send` may be called from any thread;
    `receive` from one thread only (the rank's monitor)."""

    def __init__(self, sock: socket.socket, rank: int):
        self.sock, self.rank = sock, rank
        self.lost: str | None = None     # why the supervisor is gone, once it is
        self._send_lock = threading.Lock()
        self._inbox = bytearray()
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)

    @classmethod
    def connect(cls, address: str, token: str, rank: int, timeout: float = CONNECT_SECONDS) -> "ControlClient":
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=10)
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise ControlLost(
                        f"rank {rank} cannot reach the jaxlaunch supervisor at {address} ({exc}); if the compute "
                        f"nodes reach the batch node by another address, set {CONTROL_HOST_ENV} to it") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _keepalive(sock)
        sock.settimeout(None)
        client = cls(sock, rank)
        client.send("hello", {"rank": rank, "token": token})
        return client

    @classmethod
    def from_env(cls, rank: int, env=os.environ) -> "ControlClient | None":
        """Connected to the supervisor named in the environment; None when there is none (a program
        started without jaxlaunch)."""
        if not env.get(CONTROL_ENV):
            return None
        return cls.connect(env[CONTROL_ENV], env.get(CONTROL_TOKEN_ENV, ""), rank)

    def send(self, kind: str, record) -> bool:
        if self.lost:
            return False
        try:
            with self._send_lock:
                self.sock.sendall(encode(kind, record))
            return True
        except OSError as exc:
            self.lost = self.lost or f"sending failed: {exc}"
            return False

    def receive(self, timeout: float) -> list[dict]:
        """The supervisor's messages that arrive within `timeout` seconds (all that are ready)."""
        if self.lost:
            time.sleep(timeout)
            return []
        messages = []
        deadline = time.monotonic() + timeout
        while True:
            try:  # poll, not select: a rank of a big job may hold file descriptors past select's 1024
                ready = self._poller.poll(max(0.0, deadline - time.monotonic()) * 1000)
            except (OSError, ValueError) as exc:
                self.lost = f"the connection broke: {exc}"
                return messages
            if not ready:
                return messages
            try:
                data = self.sock.recv(65536)
            except OSError as exc:
                data, why = b"", f"the connection broke: {exc}"
            else:
                why = "the supervisor closed the connection"
            if not data:
                self.lost = why
                return messages
            self._inbox += data
            while b"\n" in self._inbox:
                line, _, rest = bytes(self._inbox).partition(b"\n")
                self._inbox = bytearray(rest)
                try:
                    messages.append(json.loads(line))
                except ValueError:
                    continue
            if messages:
                return messages

    def close(self, linger: float = 2.0) -> None:
        """Say we are finished and wait (briefly) for the supervisor to close its side: closing
        with its messages unread would reset the connection and could lose our last ones."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(linger)
            while self.sock.recv(65536):
                pass
        except OSError:
            pass
        finally:
            self.sock.close()
