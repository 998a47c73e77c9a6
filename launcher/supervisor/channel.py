"""The supervisor's end of the control channel: a small TCP server, one connection per rank, one
JSON object per line (the protocol: launcher/channel.py). It keeps what the ranks said in memory,
sends them stop requests and preemption notices, appends their progress to metrics.jsonl
(launcher/rundir/metrics.py) and names a slow rank (launcher/stragglers.py). `left_early` is the
policy that names a rank which left main while its peers wait in a collective.
"""

from __future__ import annotations

import hmac
import resource
import secrets
import selectors
import socket
import threading
import time

from dataclasses import asdict

from ..channel import (HELLO_BYTES, HELLO_SECONDS, MAX_LINE, NUMBER, RANK_KINDS, AbortRequest, BadMessage,
                       PreemptNotice, StopRequest, check_rank_message, encode, has_type, parse_line)
from ..environment import CONTROL_ENV, CONTROL_TOKEN_ENV
from ..rundir import RunDirectory, atomic_write_json
from ..rundir import metrics
from ..states import Cause
from ..stragglers import Stragglers

ACCEPT_BACKOFF = (0.05, 1.0)  # accept() failing (EMFILE...): stop listening this long, doubling up to the max
REFUSALS_LOGGED = 20        # refused messages written to events.jsonl per attempt (then only counted)


def left_early(waiting: list[dict], done: list[dict]) -> AbortRequest | None:
    """A rank waits in collective #seq while a rank that has left main made fewer than seq: that
    peer will never join. The earliest such wait, or None. Linear in the ranks: the supervisor asks
    on every loop."""
    if not waiting or not done:
        return None
    peer = min(done, key=lambda d: (d["collectives"], d["time"]))
    late = [w for w in waiting if w["seq"] > peer["collectives"]]
    if not late:
        return None
    wait = min(late, key=lambda w: w["since"])
    return AbortRequest(
        wait["rank"], wait.get("host", ""), Cause.LEFT_EARLY,
        f"rank {peer['rank']} left main after {peer['collectives']} collectives, while rank {wait['rank']} "
        f"waits in {wait['name']} #{wait['seq']}", time.time(),
        collective={"seq": wait["seq"], "name": wait["name"], "seconds": round(time.time() - wait["since"], 3)},
        culprit=peer["rank"])


def _allow_many_connections() -> None:
    """One socket per rank: raise the soft limit on open files (often 1024) to the hard one."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ValueError, OSError):
        pass


class _Connection:
    def __init__(self, sock: socket.socket, opened: float):
        self.sock, self.opened = sock, opened
        self.rank: int | None = None
        self.inbox = bytearray()
        self.skipping = False  # inside a line longer than MAX_LINE: dropped up to its end
        self.outbox = bytearray()


class ControlServer:
    """The supervisor's side: one thread serves every rank's connection with a selector."""

    def __init__(self, run: RunDirectory, host: str = "127.0.0.1", size: int = 0, watchdog=None):
        self.run = run
        self.watchdog = watchdog  # the hang watchdog (watchdog.py), fed each rank's progress and phases
        self.stragglers = Stragglers(size)
        self.straggler: dict | None = None  # the latest verdict (launcher/stragglers.py)
        self._straggler_written = (None, 0.0)
        self.token = secrets.token_hex(16)
        self.size = size
        self.host = host
        self.address: str | None = None   # host:port, once started
        self._listener: socket.socket | None = None
        self._listen_again: float | None = None  # accept() failed: listen again from then (monotonic)
        self._accept_backoff = ACCEPT_BACKOFF[0]
        self.refused = 0                  # messages and connections refused (bad, forged or not ours)
        self.changed = threading.Event()    # set on every message; the supervisor's loop waits on it
        self._lock = threading.Lock()
        self._records: dict[str, dict[int, dict]] = {kind: {} for kind in RANK_KINDS}
        self._to_every_rank: list[bytes] = []  # stop and preempt, replayed to late connections
        self._connections: dict[int, _Connection] = {}
        self._selector: selectors.BaseSelector | None = None
        self._wake_read = self._wake_write = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="jaxlaunch-control", daemon=True)

    def env(self) -> dict[str, str]:
        """What every rank needs to connect."""
        return {CONTROL_ENV: self.address, CONTROL_TOKEN_ENV: self.token}

    def start(self) -> "ControlServer":
        """Bind (only now: a server that is never started holds no socket) and serve."""
        _allow_many_connections()
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._listener = socket.create_server((self.host, 0), family=family, backlog=4096)
        self._listener.setblocking(False)
        port = self._listener.getsockname()[1]
        self.address = f"[{self.host}]:{port}" if family == socket.AF_INET6 else f"{self.host}:{port}"
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and close every connection: ranks still running see their supervisor gone."""
        self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for sock in [self._listener, self._wake_read, self._wake_write,
                     *(c.sock for c in self._connections.values())]:
            if sock is None:
                continue
            try:
                sock.close()
            except OSError:
                pass
        self._connections.clear()
        if self._selector is not None:
            self._selector.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # --- supervisor -> ranks ---

    def request_stop(self, request: StopRequest) -> None:
        self._send_to_every_rank(encode("stop", request))

    def send_preempt_notice(self, notice: PreemptNotice) -> None:
        self._send_to_every_rank(encode("preempt", notice))

    def _send_to_every_rank(self, line: bytes) -> None:
        with self._lock:
            self._to_every_rank.append(line)
            for connection in self._connections.values():
                if connection.rank is not None:
                    connection.outbox += line
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except (OSError, AttributeError):  # closed, or never started
            pass

    # --- what the ranks said (in memory; copies) ---

    def _of(self, kind: str) -> list[dict]:
        with self._lock:
            return [dict(record) for record in self._records[kind].values()]

    def started(self) -> list[dict]:
        return self._of("started")

    def host_of(self, rank: int) -> str | None:
        """The host rank `rank` said it runs on (None before it started)."""
        with self._lock:
            return (self._records["started"].get(rank) or {}).get("host")

    def done(self) -> list[dict]:
        return self._of("done")

    def abort_requests(self) -> list[dict]:
        return self._of("abort")

    def notices(self) -> list[dict]:
        return self._of("notice")

    def rank_states(self) -> list[dict]:
        return self._of("state")

    def waiting(self) -> list[dict]:
        return self._of("waiting")

    def note_abort(self, request: AbortRequest) -> None:
        """The supervisor's own finding (left_early) stands for the rank it is about, ahead of
        that rank's own request."""
        with self._lock:
            self._records["abort"][request.rank] = asdict(request)

    def connected(self) -> int:
        with self._lock:
            return sum(c.rank is not None for c in self._connections.values())

    def save_records(self) -> None:
        """logs/control.json: every rank's messages of this attempt, for people and tests."""
        with self._lock:
            records = {kind: [self._records[kind][r] for r in sorted(self._records[kind])] for kind in RANK_KINDS}
        atomic_write_json(self.run.control_records, records)

    # --- the serving thread ---

    def _serve(self) -> None:
        """The serving loop. Nothing a connection sends may end it: the supervisor's view of the
        job (done, stop requests, hang reports) lives here, so an error is that connection's."""
        while not self._closed:
            try:
                ready = self._selector.select(timeout=1.0)
            except (OSError, ValueError):
                time.sleep(0.05)
                continue
            for key, events in ready:
                try:
                    self._serve_one(key, events)
                except Exception as exc:  # noqa: BLE001  (a bug of ours must not end the job's channel)
                    if isinstance(key.data, _Connection):
                        self._refuse(key.data, f"serving it failed: {exc!r}"[:200])
                        self._drop(key.data)
            try:
                self._after_select()
            except Exception:  # noqa: BLE001
                pass

    def _serve_one(self, key, events) -> None:
        if key.data == "listen":
            self._accept()
        elif key.data == "wake":
            try:
                while self._wake_read.recv(4096):
                    pass
            except (BlockingIOError, InterruptedError):
                pass
        else:
            connection = key.data
            if events & selectors.EVENT_READ:
                self._read(connection)
            if events & selectors.EVENT_WRITE and connection.sock.fileno() >= 0:
                self._flush(connection)

    def _after_select(self) -> None:
        now = time.monotonic()
        if self._listen_again is not None and now >= self._listen_again and not self._closed:
            self._listen_again = None
            self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        for connection in list(self._connections.values()):
            if connection.rank is None and now - connection.opened > HELLO_SECONDS:
                self._drop(connection)
            elif connection.outbox:
                self._flush(connection)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                self._accept_backoff = ACCEPT_BACKOFF[0]
                return
            except OSError:
                # Out of file descriptors (EMFILE, ENFILE) or memory: the pending connection stays
                # in the backlog. Stop listening a while (else select() reports it at once, again
                # and again), serve the connections we have, and try again later.
                self._selector.unregister(self._listener)
                self._listen_again = time.monotonic() + self._accept_backoff
                self._accept_backoff = min(self._accept_backoff * 2, ACCEPT_BACKOFF[1])
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(sock, time.monotonic())
            self._connections[sock.fileno()] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock.fileno(), None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    def _read(self, connection: _Connection) -> None:
        # Before its hello, a connection may hold HELLO_BYTES at most: strangers cost no memory.
        limit = HELLO_BYTES if connection.rank is None else MAX_LINE
        try:
            data = connection.sock.recv(min(65536, limit + 1))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        connection.inbox += data
        while b"\n" in connection.inbox:
            line, _, rest = bytes(connection.inbox).partition(b"\n")
            connection.inbox = bytearray(rest)
            if connection.skipping:
                connection.skipping = False
                continue
            if not self._handle(connection, line):
                if connection.rank is None:  # no secret: not one of ours
                    self._drop(connection)
                    return
                # A rank's bad message is dropped, not the rank: losing its connection would stop it.
        if len(connection.inbox) > limit:
            if connection.rank is None:
                self._refuse(connection, f"more than {HELLO_BYTES} bytes before its hello")
                self._drop(connection)
            else:
                connection.inbox.clear()
                connection.skipping = True

    def _handle(self, connection: _Connection, line: bytes) -> bool:
        """Take one message; False refuses it (and, before the hello, drops the connection)."""
        try:
            kind, message = parse_line(line)
            if connection.rank is None:
                self._hello(connection, kind, message)
                return True
            check_rank_message(kind, message)
        except BadMessage as exc:
            self._refuse(connection, str(exc))
            return False
        message["rank"] = connection.rank  # a rank speaks only for itself
        if kind == "progress" and not self._append_metrics(connection.rank, message):
            self._refuse(connection, "progress: not the shape ranks send")
            return False
        if kind == "state":  # on disk before anyone is told it came
            try:
                atomic_write_json(self.run.rank_state(connection.rank), message)
            except OSError:
                pass  # the answer is in memory; the file is for people
        with self._lock:
            kept = self._records[kind]
            if kind == "abort" and connection.rank in kept:
                return True  # its first request is the one that counts
            kept[connection.rank] = message
        if self.watchdog is not None and kind == "progress":
            self.watchdog.progress(connection.rank, message)
        elif self.watchdog is not None and kind == "phase":
            self.watchdog.phase(connection.rank, message.get("phase"))
        elif self.watchdog is not None and kind == "activity":
            self.watchdog.activity(connection.rank, message)
        elif self.watchdog is not None and kind == "done":
            self.watchdog.finish(connection.rank)
        if kind not in ("progress", "phase", "activity"):  # for people and the watchdog: no reason to wake the loop
            self.changed.set()
        return True

    def _hello(self, connection: _Connection, kind: str, message: dict) -> None:
        """Accept the connection as rank N: it must know the secret, and N must be one of the job's
        ranks that no other connection speaks for. BadMessage otherwise."""
        token, rank = message.get("token"), message.get("rank")
        # compare_digest takes ASCII strings only; a wrong length or alphabet is simply wrong.
        if (kind != "hello" or not isinstance(token, str) or not token.isascii()
                or not hmac.compare_digest(token, self.token)):
            raise BadMessage("no hello with the job's secret")
        if not has_type(rank, (int,)) or rank < 0 or (self.size and rank >= self.size):
            raise BadMessage(f"hello: rank {str(rank)[:20]} is not one of the job's {self.size} ranks")
        if any(other.rank == rank for other in self._connections.values()):
            raise BadMessage(f"hello: rank {rank} is connected already")
        connection.rank = rank
        with self._lock:
            connection.outbox += b"".join(self._to_every_rank)

    def _refuse(self, connection: _Connection, why: str) -> None:
        """Count a refused message; the first REFUSALS_LOGGED of an attempt go to events.jsonl
        (for people: somebody is probing the port, or a rank's code sends what it should not)."""
        if self.refused < REFUSALS_LOGGED:
            self.run.log_event("control_refused", rank=connection.rank, why=why[:200])
        self.refused += 1  # after the event: whoever sees the count finds the refusal in events.jsonl

    def _append_metrics(self, rank: int, message: dict) -> bool:
        """RUN_DIR/metrics.jsonl: one line per rank-0 report, one per rank per flush (its step time).
        False for a message that is not the shape ranks send (nothing is written)."""
        reports, arrivals = message.get("reports") or [], message.get("arrivals")
        if not (isinstance(reports, list) and all(isinstance(r, dict) and {"step", "time", "metrics"} <= r.keys()
                                                   for r in reports)):
            return False
        if arrivals and not (isinstance(arrivals, dict) and has_type(arrivals.get("first"), (int,))
                             and isinstance(arrivals.get("times"), list)
                             and all(has_type(t, NUMBER) for t in arrivals["times"])):
            return False
        lines = metrics.report_lines(rank, message, reports)
        if arrivals:
            self.stragglers.add(rank, arrivals["first"], list(arrivals["times"]))
            verdict = self.stragglers.verdict()
            who, written = self._straggler_written
            now = time.time()
            named = None if verdict is None else verdict["rank"]
            if named != who or (verdict is not None and now - written > 5):
                self.straggler = verdict
                self._straggler_written = (named, now)
                host = None if named is None else (self._records["started"].get(named) or {}).get("host")
                lines.append({"kind": "straggler", "time": now, **(verdict or {"rank": None}), "host": host})
        metrics.append_lines(self.run.metrics_file, lines)
        return True

    def _flush(self, connection: _Connection) -> None:
        with self._lock:
            pending = bytes(connection.outbox)
        if not pending:
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
            return
        try:
            sent = connection.sock.send(pending)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(connection)
            return
        with self._lock:
            del connection.outbox[:sent]
            left = bool(connection.outbox)
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if left else 0)
        self._selector.modify(connection.sock, events, connection)
