"""The control protocol between a job's supervisor and its ranks: every message's name and shape,
and the channel that carries them, for both sides.

The channel is one TCP connection per rank to a small server in the supervisor, carrying one JSON
object per line. Nothing polls the run directory: at 1,024 ranks on Lustre or NFS, file polling is
~10,000 metadata operations a second, and NFS's negative cache can hide a new file for 30-60 s.
Why our own few lines and not an existing engine: jax.distributed's coordination service lives only
inside JAX processes that called `initialize` (the supervisor is not one, and most jobs never call
it); torch's TCPStore would bring torch; ZeroMQ would bring a C library for what is a handful of
events per rank per job. The design is torchelastic's: the agent (our supervisor) hosts the store,
ranks connect to it, a lost connection means a lost agent.

- The supervisor binds to an address of the node it runs on (127.0.0.1 for a local run; the Slurm
  node's NodeAddr in a batch job; JAXLAUNCH_CONTROL_HOST overrides both) and gives every rank
  JAXLAUNCH_CONTROL=host:port and a per-attempt secret, JAXLAUNCH_CONTROL_TOKEN. A connection must
  open with that secret, or it is dropped.
- Ranks detect a lost supervisor by the connection's end (a killed process's kernel closes it) or
  by TCP keepalive (a dead host): about 11 s at most.
- The run directory keeps the records people read afterwards: logs/rank-N.state.json (the hang
  report) when a rank answers a stop, and logs/control.json with every rank's messages when an
  attempt ends.

Supervisor -> every rank (also replayed to a rank that connects later):
    stop        StopRequest: dump your stacks and state now, the job is being stopped
    preempt     PreemptNotice: the supervisor got a preemption notice (SIGUSR2)
Rank N -> supervisor (the first line is hello: its rank and the secret):
    started     RankStarted: the rank is up (its host and pid)
    waiting     RankWaiting: one of its collectives has waited a while (sent once per collective);
                the supervisor checks it against the ranks that have left main
    abort       AbortRequest: stop the job (a collective past collective_timeout)
    notice      NoticeSeen: a preemption notice reached this rank (and how)
    state       RankState: where the rank was when asked to stop (the hang report)
    done        RankDone: its entrypoint returned, after this many launcher collectives
"""

from __future__ import annotations

import hmac
import json
import os
import resource
import secrets
import select
import selectors
import socket
import threading
import time
from dataclasses import asdict, dataclass, field

from .rundir import RunDirectory, atomic_write_json
from .stragglers import Stragglers
from .environment import CONTROL_ENV, CONTROL_HOST_ENV, CONTROL_TOKEN_ENV

MAX_LINE = 1 << 20          # a message longer than this is a protocol error
HELLO_BYTES = 4096          # what a connection may send before its hello is accepted (a hello is ~80)
HELLO_SECONDS = 10.0        # a connection must say hello within this long
ACCEPT_BACKOFF = (0.05, 1.0)  # accept() failing (EMFILE...): stop listening this long, doubling up to the max
REFUSALS_LOGGED = 20        # refused messages written to events.jsonl per attempt (then only counted)
CONNECT_SECONDS = 60.0      # a rank keeps trying to reach the supervisor this long at start-up
# TCP keepalive on the ranks' side: a supervisor host that died silently is noticed after
# IDLE + INTERVAL * COUNT seconds.
KEEPALIVE = (5, 2, 3)
RANK_KINDS = ("started", "waiting", "abort", "notice", "state", "done", "progress")


@dataclass
class StopRequest:
    reason: str             # timeout, collective_timeout, left_early, cancelled, ...
    time: float
    detail: str | None = None
    attempt: int | None = None


@dataclass
class PreemptNotice:
    signal: str
    time: float


@dataclass
class RankStarted:
    rank: int
    host: str
    pid: int
    time: float


@dataclass
class RankWaiting:
    rank: int
    seq: int                # the collective's number on this rank (1 for the first)
    name: str
    since: float            # when it started (time.time())


@dataclass
class RankDone:
    rank: int
    collectives: int        # launcher collectives the rank made
    time: float
    stopped: dict | None = None  # the agreed preemption stop it returned at, if any


@dataclass
class AbortRequest:
    rank: int
    host: str
    reason: str             # collective_timeout or left_early
    message: str
    time: float
    collective: dict = field(default_factory=dict)  # {"seq", "name", "seconds"}
    culprit: int | None = None  # the rank that left main early


@dataclass
class NoticeSeen:
    rank: int
    sources: list[str]      # SIGUSR2, SIGTERM, supervisor
    time: float | None


# What each rank message must carry, and of which JSON type, before anything reads it: a message
# without them (or with others' types) is refused, so no field access downstream can fail.
# (JSON numbers: int or float, never bool; None where a field may be null.)
NUMBER = (int, float)
MESSAGE_FIELDS: dict[str, dict[str, tuple]] = {
    "started": {"host": (str,), "pid": (int,), "time": NUMBER},
    "waiting": {"seq": (int,), "name": (str,), "since": NUMBER},
    "abort": {"reason": (str,), "message": (str,), "time": NUMBER},
    "notice": {"sources": (list,)},
    "state": {"time": NUMBER, "reason": (str,)},
    "done": {"collectives": (int,), "time": NUMBER},
    "progress": {},
}
OPTIONAL_FIELDS: dict[str, dict[str, tuple]] = {
    "abort": {"host": (str,), "collective": (dict,), "culprit": (int, type(None))},
    "notice": {"time": (int, float, type(None))},
    "state": {"host": (str,), "where": (str, type(None)), "collectives_started": (int,),
              "collectives_completed": (int,), "waiting_in": (dict, type(None))},
    "done": {"stopped": (dict, type(None))},
}
# The reasons a rank may give for stopping the job (the supervisor finds left_early itself).
RANK_ABORT_REASONS = ("collective_timeout",)


class BadMessage(ValueError):
    """A message that is not what the protocol says: refused (that message, or the connection
    before its hello), never the serving thread."""


def _is(value, types: tuple) -> bool:
    return isinstance(value, types) and not isinstance(value, bool) or (value is None and type(None) in types)


def parse_line(line: bytes) -> tuple[str, dict]:
    """(kind, fields) of one line; BadMessage for anything but a JSON object with a string kind
    (deep nesting, NaN/Infinity, invalid UTF-8 and lone surrogates included)."""
    try:
        message = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadMessage(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
        raise BadMessage("not a JSON object with a kind")
    kind = message.pop("kind")
    try:
        json.dumps(message, ensure_ascii=False).encode()  # lone surrogates cannot be written anywhere
    except (UnicodeEncodeError, ValueError, RecursionError):
        raise BadMessage("a string that is not text (a lone surrogate)") from None
    return kind, message


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number")


def check_rank_message(kind: str, message: dict) -> None:
    """BadMessage unless `message` is a `kind` the ranks send, with its fields of their types."""
    if kind not in MESSAGE_FIELDS:
        raise BadMessage(f"unknown kind {kind[:40]!r}")
    for name, types in MESSAGE_FIELDS[kind].items():
        if name not in message or not _is(message[name], types):
            raise BadMessage(f"{kind}: {name} missing or not {'/'.join(t.__name__ for t in types)}")
    for name, types in OPTIONAL_FIELDS.get(kind, {}).items():
        if name in message and not _is(message[name], types):
            raise BadMessage(f"{kind}: {name} is not {'/'.join(t.__name__ for t in types)}")
    if kind == "abort" and message["reason"] not in RANK_ABORT_REASONS:
        raise BadMessage(f"abort: a rank cannot stop the job for {message['reason'][:40]!r}")
    if kind == "notice" and not all(isinstance(source, str) for source in message["sources"]):
        raise BadMessage("notice: sources must be strings")
    stopped = message.get("stopped") if kind == "done" else None
    if stopped is not None and not (isinstance(stopped.get("sources", []), list)
                                    and all(isinstance(x, str) for x in stopped.get("sources", []))):
        raise BadMessage("done: stopped.sources must be strings")


def encode(kind: str, record) -> bytes:
    body = asdict(record) if not isinstance(record, dict) else dict(record)
    return (json.dumps({"kind": kind, **body}, separators=(",", ":"), default=str) + "\n").encode()


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


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
        wait["rank"], wait.get("host", ""), "left_early",
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

    def __init__(self, run: RunDirectory, host: str = "127.0.0.1", size: int = 0):
        self.run = run
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
        if kind != "progress":  # progress is for people: no reason to wake the supervisor's loop
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
        if not _is(rank, (int,)) or rank < 0 or (self.size and rank >= self.size):
            raise BadMessage(f"hello: rank {str(rank)[:20]} is not one of the job's {self.size} ranks")
        if any(other.rank == rank for other in self._connections.values()):
            raise BadMessage(f"hello: rank {rank} is connected already")
        connection.rank = rank
        with self._lock:
            connection.outbox += b"".join(self._to_every_rank)

    def _refuse(self, connection: _Connection, why: str) -> None:
        """Count a refused message; the first REFUSALS_LOGGED of an attempt go to events.jsonl
        (for people: somebody is probing the port, or a rank's code sends what it should not)."""
        self.refused += 1
        if self.refused <= REFUSALS_LOGGED:
            self.run.log_event("control_refused", rank=connection.rank, why=why[:200])

    def _append_metrics(self, rank: int, message: dict) -> bool:
        """RUN_DIR/metrics.jsonl: one line per rank-0 report, one per rank per flush (its step time).
        False for a message that is not the shape ranks send (nothing is written)."""
        reports, arrivals = message.get("reports") or [], message.get("arrivals")
        if not (isinstance(reports, list) and all(isinstance(r, dict) and {"step", "time", "metrics"} <= r.keys()
                                                   for r in reports)):
            return False
        if arrivals and not (isinstance(arrivals, dict) and _is(arrivals.get("first"), (int,))
                             and isinstance(arrivals.get("times"), list)
                             and all(_is(t, NUMBER) for t in arrivals["times"])):
            return False
        lines = [{"kind": "metrics", "step": r["step"], "time": r["time"], "total": message.get("total"),
                  "metrics": r["metrics"]} for r in reports]
        if message.get("step") is not None:
            lines.append({"kind": "rank", "rank": rank, "step": message["step"], "time": message.get("time"),
                          "total": message.get("total"), "step_seconds": message.get("step_seconds")})
        if arrivals:
            self.stragglers.add(rank, arrivals["first"], list(arrivals["times"]))
            verdict = self.stragglers.verdict()
            who, written = self._straggler_written
            now = time.time()
            named = None if verdict is None else verdict["rank"]
            if named != who or (verdict is not None and now - written > 5):
                self.straggler = verdict
                self._straggler_written = (named, now)
                host = (self._records["started"].get(named) or {}).get("host") if named is not None else None
                lines.append({"kind": "straggler", "time": now, **(verdict or {"rank": None}), "host": host})
        if not lines:
            return True
        try:
            with open(self.run.metrics_file, "a") as out:
                out.write("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
        except OSError:
            pass  # progress is for people; the job goes on
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


def control_host(env=os.environ) -> str:
    """The address the supervisor binds to: JAXLAUNCH_CONTROL_HOST, else (in a Slurm job) the
    batch node's NodeAddr, else 127.0.0.1."""
    if env.get(CONTROL_HOST_ENV):
        return env[CONTROL_HOST_ENV]
    node = env.get("SLURMD_NODENAME")
    if node:
        from .backends.slurm import scheduler

        try:
            for word in scheduler.call_slurm(["scontrol", "show", "node", "--oneliner", node], timeout=20).split():
                if word.startswith("NodeAddr="):
                    return socket.gethostbyname(word.partition("=")[2])
        except (scheduler.SchedulerError, OSError):
            pass
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            pass
    return "127.0.0.1"


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
