"""The rank's side of supervision: collective tracking, stack dumps, the collective watchdog and
early-exit detection.

The supervisor (launcher/supervisor/) and the ranks talk through the control channel
(launcher/control.py: every message's name and shape, for both sides):
- the supervisor asks every rank for its stacks and state before it tears the job down (timeout,
  signal, watchdog);
- a rank says when its entrypoint has returned, with how many launcher collectives it made;
- a rank asks the supervisor to stop the job: one of its collectives waited past
  `collective_timeout`, or it waits in a collective that a rank which has already left `main` will
  never join.

One daemon thread per rank polls the channel a few times a second. It runs while the main thread is
blocked in MPI or in `block_until_ready`, since both release the GIL. A rank stuck in C code that
holds the GIL cannot answer; the supervisor then reports it as not answering. faulthandler covers
crashes (SIGSEGV, SIGABRT, ...) in C, and SIGQUIT dumps every thread's stack on demand
(`kill -QUIT PID`, as the JVM does), both straight into the rank's log file.

The collective tracker (tracker.py) is the hot path every launcher collective passes through.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from pathlib import Path

from ..control import AbortRequest, ControlChannel, NoticeSeen, RankDone, RankStarted
from . import preemption
from .topology import node_name
from .tracker import TRACKER, CollectiveTracker  # noqa: F401  (CollectiveTracker: for callers of this module)

POLL_SECONDS = 0.2
# A rank waiting in a collective that a finished peer never joined is reported after this long;
# the short grace lets a peer's last collective land before its done file is read.
EARLY_EXIT_GRACE_SECONDS = 1.0
DUMP_SIGNAL = signal.SIGQUIT


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
        self.channel = ControlChannel(run)

    def start(self) -> "RankMonitor":
        self.channel.prepare()
        # An fd of our own on the log, kept open for the life of the process: faulthandler writes
        # to it from a signal handler, after Python's own file objects may be closed.
        self._dump_fd = os.open(self.run.rank_log(self.rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        faulthandler.enable(file=self._dump_fd, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, file=self._dump_fd, all_threads=True, chain=False)
        self.channel.mark_started(RankStarted(self.rank, self.host, os.getpid(), time.time()))
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
        if not self.answered_stop:
            stop = self.channel.stop_request()
            if stop is not None:
                self.answered_stop = preemption.NOTICE.stopping = True
                self.report_state(stop.get("reason", "stop"))
        if not preemption.NOTICE.sources & preemption.SOURCES["supervisor"] and self.channel.preempt_noticed():
            preemption.NOTICE.set("supervisor")
        self.report_notice()
        if self.requested_abort:
            return
        waiting = self.tracker.oldest_waiting()
        if waiting is None:
            return
        seq, name, waited = waiting
        past_timeout = self.collective_timeout is not None and waited > self.collective_timeout
        # A peer that already left main is the cause, even past collective_timeout (which may be
        # shorter than the grace): it will never join, and the watchdog would only say "hung".
        if waited >= EARLY_EXIT_GRACE_SECONDS or past_timeout:
            for record in self.channel.done():
                if record.get("collectives", seq) < seq:
                    peer = record["rank"]
                    self.request_abort(
                        "left_early", seq, name, waited,
                        f"rank {peer} left main after {record['collectives']} collectives, while rank {self.rank} "
                        f"waits in {name} #{seq}", culprit=peer)
                    return
        if past_timeout:
            self.request_abort("collective_timeout", seq, name, waited,
                               f"{name} #{seq} on rank {self.rank} waited {waited:.0f} s, past collective_timeout="
                               f"{self.collective_timeout:g} s")

    def report_notice(self) -> None:
        """Tell the supervisor a notice reached this rank, even if the job then dies before it can
        stop (mpirun mode: Slurm's SIGTERM also ends mpirun)."""
        notice = preemption.NOTICE
        if notice.sources and not self.reported_notice:
            self.reported_notice = True
            sources = notice.names(notice.sources)
            self.channel.report_notice(NoticeSeen(self.rank, sources, notice.received))
            if sources != ["supervisor"]:  # the supervisor logged its own notice
                self.run.log_event("notice", source=",".join(sources), rank=self.rank, received=notice.received)

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
        self.channel.report_state(self.rank, self.state(reason))

    def request_abort(self, reason, seq, name, waited, message, culprit=None) -> None:
        self.requested_abort = True
        self.channel.request_abort(AbortRequest(
            self.rank, self.host, reason, message, time.time(),
            collective={"seq": seq, "name": name, "seconds": round(waited, 3)}, culprit=culprit))


def write_done(run, rank: int, tracker: CollectiveTracker = TRACKER) -> None:
    """Mark that this rank's entrypoint returned, after `tracker.count` collectives; `stopped` says
    it returned at an agreed preemption stop (should_stop() was True), not at the end of the work."""
    ControlChannel(run).mark_done(RankDone(rank, tracker.count, time.time(), stopped=preemption.NOTICE.agreed))
