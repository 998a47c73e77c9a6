"""The rank's side of supervision: collective tracking, stack dumps, the collective watchdog and
early-exit detection.

The supervisor (launcher/supervisor/) and the ranks talk through small files in the run directory
(see `RunDirectory`: control/ and logs/), which works the same for local runs and Slurm jobs on any
number of nodes, whatever launched the ranks:
- the supervisor writes control/stop.json to ask every rank for its stacks and state before it
  tears the job down (timeout, signal, watchdog);
- a rank writes control/done-rank-N.json when its entrypoint has returned, with how many launcher
  collectives it made;
- a rank writes control/abort-rank-N.json to ask the supervisor to stop the job: one of its
  collectives waited past `collective_timeout`, or it waits in a collective that a rank which has
  already left `main` will never join.

One daemon thread per rank polls those files a few times a second. It runs while the main thread is
blocked in MPI or in `block_until_ready`, since both release the GIL. A rank stuck in C code that
holds the GIL cannot answer; the supervisor then reports it as not answering. faulthandler covers
crashes (SIGSEGV, SIGABRT, ...) in C, and SIGQUIT dumps every thread's stack on demand
(`kill -QUIT PID`, as the JVM does), both straight into the rank's log file.

The hot path is `TRACKER.start`/`dispatched` in every launcher collective: a counter, a list store
and an attribute store (blocking mpi4py calls also read the clock).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from .topology import node_name

POLL_SECONDS = 0.2
# A rank waiting in a collective that a finished peer never joined is reported after this long;
# the short grace lets a peer's last collective land before its done file is read.
EARLY_EXIT_GRACE_SECONDS = 1.0
DUMP_SIGNAL = signal.SIGQUIT


class CollectiveTracker:
    """Which launcher collectives this rank has started, and which it still waits for.

    The hot path only counts: `start` bumps a counter and notes the name, `dispatched` keeps the
    output of the latest asynchronous (mpi4jax) call. Completion is worked out by the monitor
    thread alone: at each poll it keeps (count, latest output) as a snapshot, and once that output
    is ready every collective up to the snapshot's count has finished (a device runs its
    computations in order). Blocking calls (mpi4py) are pending between enter() and leave().
    Every public collective counts once, so the sequence numbers agree across ranks.
    """

    NAMES = 256  # names kept for the last 256 collectives

    def __init__(self):
        self.count = 0
        self.names = [""] * self.NAMES
        self.latest = None    # output of the latest asynchronous collective
        self.blocking = None  # (seq, name, started) while inside a blocking MPI call
        # the monitor thread's own state
        self.confirmed = 0    # every collective up to this one has finished
        self._snapshot = None  # (count, output) taken at an earlier poll
        self._oldest = None   # (seq, first seen) of the oldest collective not known to be finished

    def start(self, name: str) -> int:
        self.count += 1
        self.names[self.count % self.NAMES] = name
        return self.count

    def dispatched(self, seq: int, name: str, handle) -> None:
        self.latest = handle

    def enter(self, seq: int, name: str) -> None:
        self.blocking = (seq, name, time.monotonic())

    def leave(self) -> None:
        self.blocking = None

    def name_of(self, seq: int) -> str:
        return self.names[seq % self.NAMES] if self.count - seq < self.NAMES else "collective"

    def observe(self) -> None:
        """Advance what is known to have finished (monitor thread only)."""
        if self._snapshot is not None:
            count, output = self._snapshot
            try:
                ready = output is None or output.is_ready()
            except Exception:  # noqa: BLE001  (a deleted buffer has finished too)
                ready = True
            if ready:
                self.confirmed = max(self.confirmed, count)
                self._snapshot = None
        count, latest = self.count, self.latest
        if self._snapshot is None and count > self.confirmed:
            self._snapshot = (count, latest)
        if self._oldest is not None and self._oldest[0] <= self.confirmed:
            self._oldest = None
        if self._oldest is None and count > self.confirmed:
            self._oldest = (self.confirmed + 1, time.monotonic())

    def oldest_waiting(self) -> tuple[int, str, float] | None:
        """(seq, name, seconds waited) of the oldest collective not known to have finished, or None.
        The wait of an asynchronous one counts from the poll that first saw it (+- one poll)."""
        self.observe()
        now = time.monotonic()
        candidates = []
        if self._oldest is not None:
            seq, seen = self._oldest
            candidates.append((seq, self.name_of(seq), now - seen))
        blocking = self.blocking
        if blocking is not None:
            candidates.append((blocking[0], blocking[1], now - blocking[2]))
        return min(candidates) if candidates else None

    def completed(self) -> int:
        waiting = self.oldest_waiting()
        return self.count if waiting is None else waiting[0] - 1


TRACKER = CollectiveTracker()


def _is_own_code(filename: str) -> bool:
    """True for the job's files: not jaxlaunch, not the standard library, not an installed package."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    launcher_dir = str(Path(__file__).resolve().parent.parent)
    if path.startswith(launcher_dir + os.sep):
        return False
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if path.startswith(os.path.join(prefix, "lib") + os.sep):
            return False
    return "site-packages" not in path and "dist-packages" not in path


def where_is(thread_id: int) -> str:
    """'file.py:LINE in FUNCTION' for the innermost frame of the job's own code in that thread,
    else the innermost frame at all."""
    frame = sys._current_frames().get(thread_id)
    innermost = None
    while frame is not None:
        code = frame.f_code
        text = f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        innermost = innermost or text
        if _is_own_code(code.co_filename):
            return text
        frame = frame.f_back
    return innermost or "(no Python frame)"


class RankMonitor:
    """The per-rank daemon thread described in the module doc."""

    def __init__(self, run, rank: int, size: int, collective_timeout: float | None,
                 tracker: CollectiveTracker = TRACKER):
        self.run, self.rank, self.size = run, rank, size
        self.collective_timeout = collective_timeout
        self.tracker = tracker
        self.host = node_name(os.environ)
        self.main_thread = threading.main_thread().ident
        self.answered_stop = False
        self.requested_abort = False
        self.reported_notice = False
        self._stop = threading.Event()
        self._dump_fd = None

    def start(self) -> "RankMonitor":
        self.run.control.mkdir(parents=True, exist_ok=True)
        # An fd of our own on the log, kept open for the life of the process: faulthandler writes
        # to it from a signal handler, after Python's own file objects may be closed.
        self._dump_fd = os.open(self.run.rank_log(self.rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        faulthandler.enable(file=self._dump_fd, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, file=self._dump_fd, all_threads=True, chain=False)
        from ..rundir import atomic_write_json

        atomic_write_json(self.run.control / f"started-rank-{self.rank}.json",
                          {"rank": self.rank, "host": self.host, "pid": os.getpid(), "time": time.time()})
        self._thread = threading.Thread(target=self._loop, name="jaxlaunch-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread before the interpreter shuts down: a daemon thread that touches JAX
        arrays while the runtime is torn down aborts the process."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.report_notice()  # a notice that came after the last poll
        self.tracker.latest = self.tracker._snapshot = None

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001  (the monitor must never take the rank down)
                os.write(self._dump_fd, f"jaxlaunch monitor: {exc!r}\n".encode())

    def check(self) -> None:
        from .preemption import NOTICE, NOTICE_FILE, SOURCES

        stop = self.run.control / "stop.json"
        if not self.answered_stop and stop.exists():
            self.answered_stop = NOTICE.stopping = True
            self.report_state(_read_json(stop).get("reason", "stop"))
        if not NOTICE.sources & SOURCES["supervisor"] and (self.run.control / NOTICE_FILE).exists():
            NOTICE.set("supervisor")
        self.report_notice()
        if self.requested_abort:
            return
        waiting = self.tracker.oldest_waiting()
        if waiting is None:
            return
        seq, name, waited = waiting
        if self.collective_timeout is not None and waited > self.collective_timeout:
            self.request_abort("collective_timeout", seq, name, waited,
                               f"{name} #{seq} on rank {self.rank} waited {waited:.0f} s, past collective_timeout="
                               f"{self.collective_timeout:g} s")
            return
        if waited < EARLY_EXIT_GRACE_SECONDS:
            return
        for done in self.run.control.glob("done-rank-*.json"):
            record = _read_json(done)
            if record.get("collectives", seq) < seq:
                peer = record["rank"]
                self.request_abort(
                    "left_early", seq, name, waited,
                    f"rank {peer} left main after {record['collectives']} collectives, while rank {self.rank} "
                    f"waits in {name} #{seq}", culprit=peer)
                return

    def report_notice(self) -> None:
        """Tell the supervisor a notice reached this rank, even if the job then dies before it can
        stop (mpirun mode: Slurm's SIGTERM also ends mpirun)."""
        from .preemption import NOTICE

        if NOTICE.sources and not self.reported_notice:
            self.reported_notice = True
            from ..rundir import atomic_write_json

            sources = NOTICE.names(NOTICE.sources)
            atomic_write_json(self.run.control / f"notice-rank-{self.rank}.json",
                              {"rank": self.rank, "sources": sources, "time": NOTICE.received})
            if sources != ["supervisor"]:  # the supervisor logged its own notice
                self.run.log_event("notice", source=",".join(sources), rank=self.rank, received=NOTICE.received)

    def state(self, reason: str) -> dict:
        waiting = self.tracker.oldest_waiting()
        return {
            "rank": self.rank, "host": self.host, "pid": os.getpid(), "time": time.time(), "reason": reason,
            "collectives_started": self.tracker.count, "collectives_completed": self.tracker.completed(),
            "waiting_in": None if waiting is None else {"seq": waiting[0], "name": waiting[1],
                                                       "seconds": round(waiting[2], 3)},
            "where": where_is(self.main_thread),
            "main_thread": f"0x{self.main_thread:016x}",
        }

    def report_state(self, reason: str) -> None:
        """Dump every thread's stack into the log, then write logs/rank-N.state.json."""
        header = f"\njaxlaunch: stacks of rank {self.rank} ({reason}); main thread 0x{self.main_thread:016x}\n"
        os.write(self._dump_fd, header.encode())
        faulthandler.dump_traceback(file=self._dump_fd, all_threads=True)
        from ..rundir import atomic_write_json

        atomic_write_json(self.run.rank_state(self.rank), self.state(reason))

    def request_abort(self, reason, seq, name, waited, message, culprit=None) -> None:
        from ..rundir import atomic_write_json

        self.requested_abort = True
        atomic_write_json(self.run.control / f"abort-rank-{self.rank}.json", {
            "rank": self.rank, "host": self.host, "reason": reason, "message": message, "time": time.time(),
            "collective": {"seq": seq, "name": name, "seconds": round(waited, 3)},
            "culprit": culprit,
        })


def write_done(run, rank: int, tracker: CollectiveTracker = TRACKER) -> None:
    """Mark that this rank's entrypoint returned, after `tracker.count` collectives; `stopped` says
    it returned at an agreed preemption stop (should_stop() was True), not at the end of the work."""
    from ..rundir import atomic_write_json
    from .preemption import NOTICE

    atomic_write_json(run.control / f"done-rank-{rank}.json",
                      {"rank": rank, "collectives": tracker.count, "time": time.time(), "stopped": NOTICE.agreed})


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
