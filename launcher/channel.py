"""The control channel's protocol, shared by its two ends: every message's name and shape, how a
line is read and checked, and how one is written. The supervisor's end is
launcher/supervisor/channel.py (the server); a rank's end is launcher/rank/channel.py (the client).

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
    phase       PhaseChange: its main thread started or stopped compiling or a checkpoint save or
                restore (the hang watchdog does not count compiling and allows a checkpoint longer)
    activity    Activity: every 2 s, whether the rank's main thread's stack moved, where it is and
                how busy the process was (the hang watchdog's progress without ctx.report)
    state       RankState: where the rank was when asked to stop (the hang report)
    done        RankDone: its entrypoint returned, after this many launcher collectives
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

MAX_LINE = 1 << 20          # a message longer than this is a protocol error
HELLO_BYTES = 4096          # what a connection may send before its hello is accepted (a hello is ~80)
HELLO_SECONDS = 10.0        # a connection must say hello within this long
RANK_KINDS = ("started", "waiting", "abort", "notice", "state", "done", "progress", "phase", "activity")


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
class PhaseChange:
    rank: int
    phase: str | None       # compiling, checkpoint, or None (back to the job's own work)
    time: float


@dataclass
class Activity:
    rank: int
    time: float
    stack: str              # a fingerprint of the main thread's stack (ranks at one place share it)
    moved: int              # 1: the stack changed since the last Activity, 0: it stood still
    busy: float             # the process's CPU seconds per second since the last Activity
    where: str              # the innermost frame of the job's own code
    # Evidence of work beside the stack (launcher/rank/evidence.py); absent from older ranks.
    children_busy: float = 0.0  # CPU seconds per second of the rank's descendant processes
    io: float = 0.0         # bytes per second the rank moved to or from storage, or its descendants moved
    doing: str | None = None  # what the main thread does where it stands still (stacks.py's kinds), else None


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
    "phase": {"time": NUMBER},
    "activity": {"time": NUMBER, "stack": (str,), "moved": (int,), "busy": NUMBER, "where": (str,)},
}


OPTIONAL_FIELDS: dict[str, dict[str, tuple]] = {
    "abort": {"host": (str,), "collective": (dict,), "culprit": (int, type(None))},
    "notice": {"time": (int, float, type(None))},
    "state": {"host": (str,), "where": (str, type(None)), "collectives_started": (int,),
              "collectives_completed": (int,), "waiting_in": (dict, type(None)), "place": (dict,)},
    "phase": {"phase": (str, type(None))},
    "activity": {"children_busy": NUMBER, "io": NUMBER, "doing": (str, type(None))},
    "done": {"stopped": (dict, type(None))},
}


# The reasons a rank may give for stopping the job (the supervisor finds left_early itself).
RANK_ABORT_REASONS = ("collective_timeout",)


class BadMessage(ValueError):
    """A message that is not what the protocol says: refused (that message, or the connection
    before its hello), never the serving thread."""


def has_type(value, types: tuple) -> bool:
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
        if name not in message or not has_type(message[name], types):
            raise BadMessage(f"{kind}: {name} missing or not {'/'.join(t.__name__ for t in types)}")
    for name, types in OPTIONAL_FIELDS.get(kind, {}).items():
        if name in message and not has_type(message[name], types):
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
