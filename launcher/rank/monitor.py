"""The rank's side of supervision: collective tracking, stack dumps, the collective watchdog and
early-exit detection.

The supervisor (launcher/supervisor/) and the ranks talk over the control channel
(launcher/channel.py: every message's name and shape; this end in rank/channel.py):
- the supervisor asks every rank for its stacks and state before it tears the job down (timeout,
  signal, watchdog), and passes a preemption notice on;
- a rank says when its entrypoint has returned, with how many launcher collectives it made;
- a rank says when one of its collectives has waited EARLY_EXIT_GRACE_SECONDS: the supervisor
  knows which ranks have left `main`, and stops the job if one of them will never join;
- a rank asks the supervisor to stop the job when one of its collectives waited past
  `collective_timeout`.

One daemon thread per rank waits on that connection, waking every POLL_SECONDS to look at the
collective tracker (memory only: a rank makes no filesystem calls while it waits). It runs while the
main thread is blocked in MPI or in `block_until_ready`, since both release the GIL. A rank stuck in
C code that holds the GIL cannot answer; the supervisor then reports it as not answering.
faulthandler covers crashes (SIGSEGV, SIGABRT, ...) in C, and SIGQUIT dumps every thread's stack on
demand (`kill -QUIT PID`, as the JVM does), both straight into the rank's log file.

When the connection is lost (the supervisor died), the rank does not run on orphaned: should_stop()
turns True at once (a job that checks it checkpoints and returns), and ORPHAN_EXIT_SECONDS later the
rank dumps its stacks and exits.

The collective tracker (tracker.py) is the hot path every launcher collective passes through.
Where the main thread is (compiling, in a checkpoint, waiting in XLA...) is read from its stack
(stacks.py): the supervisor's hang watchdog and roll-call use it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

from ..channel import AbortRequest, Activity, NoticeSeen, PhaseChange, RankDone, RankStarted, RankWaiting
from .channel import ControlClient
from . import preemption
from .progress import FLUSH_SECONDS, ProgressReporter
from . import evidence, stacks
from .topology import node_name
from .tracker import TRACKER, CollectiveTracker  # noqa: F401  (CollectiveTracker: for callers of this module)

POLL_SECONDS = 0.2
# How often a rank tells the supervisor whether its main thread's stack moved (and where it is).
ACTIVITY_SECONDS = 2.0
MOVE_SWITCHES = 3  # the main thread gave up the CPU this often in a window: it moved
# A collective that waited this long is reported to the supervisor, which stops the job if a rank
# that has left main will never join it; the grace lets a peer's last collective land first.
EARLY_EXIT_GRACE_SECONDS = 1.0
# A rank whose supervisor is gone exits this long after should_stop() turned True for it.
ORPHAN_EXIT_SECONDS = 15.0
EXIT_ORPHANED = 75
DUMP_SIGNAL = signal.SIGQUIT


def main_thread_switches(native_id: int | None) -> int | None:
    """The main thread's voluntary context switches so far (Linux's /proc), None elsewhere."""
    try:
        with open(f"/proc/self/task/{native_id}/status", "rb") as status:
            for line in status:
                if line.startswith(b"voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class RankMonitor:
    """The per-rank daemon thread described in the module doc. `client` None: started without a
    supervisor (no jaxlaunch around it): stacks on SIGQUIT and crashes only."""

    def __init__(self, run, rank: int, size: int, collective_timeout: float | None,
                 tracker: CollectiveTracker = TRACKER, client: ControlClient | None = None):
        self.run, self.rank, self.size = run, rank, size
        self.collective_timeout = collective_timeout
        self.tracker = tracker
        self.client = client
        self.host = node_name(os.environ)
        self.main_thread = threading.main_thread().ident
        self.answered_stop = False
        self.requested_abort = False
        self.reported_notice = False
        self.reported_wait: int | None = None  # the collective we last told the supervisor about
        self.phase: str | None = None  # compiling or checkpoint: the hang watchdog allows those longer
        # The main thread's stack, for the watchdog of programs that never report (report_phase).
        self._stack, self._moved = "", False
        self._cpu, self._activity_at = time.process_time(), time.monotonic()
        self._main_native_id = threading.main_thread().native_id
        self._switches = main_thread_switches(self._main_native_id)
        self._next_activity = self._activity_at + ACTIVITY_SECONDS
        self._children_cpu, self._moved_bytes = evidence.sample()
        self._kinds: dict[str, str | None] = {}  # stack fingerprint -> its kind (stacks.place)
        self.lost_at: float | None = None
        self.progress = ProgressReporter(rank)
        # Rank 0's metrics go every poll: a crash loses at most POLL_SECONDS of them (goodput counts
        # the steps a restart computes again from them); the others' step times every FLUSH_SECONDS.
        self._flush_every = POLL_SECONDS if rank == 0 else FLUSH_SECONDS
        self._next_flush = time.monotonic() + self._flush_every
        self._arrivals_sent = 0  # the last collective whose arrival time was sent
        self._first_logged = False
        self._stop = threading.Event()
        self._dump_fd = None

    def start(self) -> "RankMonitor":
        # An fd of our own on the log, kept open for the life of the process: faulthandler writes
        # to it from a signal handler, after Python's own file objects may be closed.
        self._dump_fd = os.open(self.run.rank_log(self.rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        faulthandler.enable(file=self._dump_fd, all_threads=True)
        faulthandler.register(DUMP_SIGNAL, file=self._dump_fd, all_threads=True, chain=False)
        self.send("started", RankStarted(self.rank, self.host, os.getpid(), time.time()))
        self._thread = threading.Thread(target=self._loop, name="jaxlaunch-monitor", daemon=True)
        self._thread.start()
        return self

    def send(self, kind: str, record) -> None:
        if self.client is not None:
            self.client.send(kind, record)

    def stop(self) -> None:
        """End the thread before the interpreter shuts down: a daemon thread that touches JAX
        arrays while the runtime is torn down aborts the process."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.report_notice()  # a notice that came after the last poll
        self.tracker.latest = self.tracker.snapshot = None

    def finish(self, tracker: CollectiveTracker | None = None) -> None:
        """After stop(): say this rank's entrypoint returned, after `tracker.count` collectives;
        `stopped` says it returned at an agreed preemption stop (should_stop() was True), or after
        its notice was delivered as the spec's preemption_signal, not at the end of the work. Then close the connection."""
        tracker = tracker or self.tracker
        self.flush_progress(final=True)
        self.send("done", RankDone(self.rank, tracker.count, time.time(), stopped=preemption.NOTICE.stopped))
        if self.client is not None:
            self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.client is None:
                    self._stop.wait(POLL_SECONDS)
                else:
                    for message in self.client.receive(POLL_SECONDS):
                        self.on_message(message)
                    if self.client.lost:
                        self.on_lost()
                self.check()
                if time.monotonic() >= self._next_flush:
                    self._next_flush = time.monotonic() + self._flush_every
                    self.flush_progress()
            except Exception as exc:  # noqa: BLE001  (the monitor must never take the rank down)
                os.write(self._dump_fd, f"jaxlaunch monitor: {exc!r}\n".encode())

    def flush_progress(self, final: bool = False) -> None:
        """Send what was reported; `final` (main has returned): all of it, waiting for its values."""
        while True:
            self._flush_once(final)
            if not (self.progress.queued if final else self.progress.pending):
                return

    def _flush_once(self, final: bool = False) -> None:
        if self.rank == 0 and self.progress.first is not None and not self._first_logged and self.run is not None:
            self._first_logged = True  # the start-up budget's end (launcher/rundir/goodput.py)
            at, compiled = self.progress.first
            self.run.log_event("first_report", at=at, compile_seconds=compiled)
        message = self.progress.take(wait=final)
        first, times = self.tracker.arrivals_since(self._arrivals_sent)
        if times:
            self._arrivals_sent = first + len(times) - 1
            message = message or {}
            message["arrivals"] = {"first": first, "times": times}
        if message:
            self.send("progress", message)

    def on_message(self, message: dict) -> None:
        kind = message.get("kind")
        if kind == "stop" and not self.answered_stop:
            self.answered_stop = preemption.NOTICE.stopping = True
            self.report_state(message.get("reason", "stop"))
        elif kind == "preempt" and not preemption.NOTICE.sources & preemption.SOURCES["supervisor"]:
            preemption.NOTICE.set("supervisor")

    def on_lost(self) -> None:
        """The supervisor is gone: stop at the next should_stop(), and exit soon in any case."""
        now = time.monotonic()
        if self.lost_at is None:
            self.lost_at = now
            os.write(self._dump_fd, (
                f"jaxlaunch: rank {self.rank} lost its supervisor ({self.client.lost}): should_stop() is True from "
                f"now on, and the rank exits in {ORPHAN_EXIT_SECONDS:g} s\n").encode())
            preemption.NOTICE.set("supervisor")
        elif now - self.lost_at > ORPHAN_EXIT_SECONDS:
            self.report_state("supervisor_lost")
            os.write(self._dump_fd, f"jaxlaunch: rank {self.rank} exits: its supervisor is gone\n".encode())
            os._exit(EXIT_ORPHANED)

    def check(self) -> None:
        preemption.NOTICE.deliver_held()
        self.report_notice()
        self.report_phase()
        if self.requested_abort:
            return
        waiting = self.tracker.oldest_waiting()
        if waiting is None:
            return
        seq, name, waited = waiting
        limit, limit_name = self.collective_timeout, "collective_timeout"
        blocking, own = self.tracker.blocking, self.tracker.blocking_timeout
        if blocking is not None and blocking[0] == seq and own is not None and (limit is None or own < limit):
            limit, limit_name = own, "its timeout"
        past_timeout = limit is not None and waited > limit
        if (waited >= EARLY_EXIT_GRACE_SECONDS or past_timeout) and self.reported_wait != seq:
            # The supervisor knows who has left main; it decides whether that peer will never join.
            self.reported_wait = seq
            self.send("waiting", RankWaiting(self.rank, seq, name, time.time() - waited))
        if past_timeout:
            self.request_abort("collective_timeout", seq, name, waited,
                               f"{name} #{seq} on rank {self.rank} waited {waited:.0f} s, past {limit_name}="
                               f"{limit:g} s")

    def report_phase(self) -> None:
        """Tell the supervisor when the main thread starts or stops compiling or saving/restoring a
        checkpoint: its hang watchdog does not count compiling, and allows a checkpoint longer.
        Every ACTIVITY_SECONDS, say whether the main thread's stack moved since the last time, and
        where it is: the watchdog's progress for a program that never calls ctx.report."""
        frames = stacks.stack_of(self.main_thread)
        phase = stacks.phase(self.main_thread, frames)
        if phase != self.phase:
            self.phase = phase
            self.send("phase", PhaseChange(self.rank, phase, time.time()))
        stack = stacks.fingerprint(frames)
        if stack != self._stack:
            self._stack, self._moved = stack, True
        now = time.monotonic()
        if now >= self._next_activity:
            # A loop that mostly sleeps or waits briefly shows one stack at every sample, but its main
            # thread gives up the CPU again and again; one blocked for good (a dead filesystem, a
            # collective) does not (measured: 0 switches in 4 s while waiting in XLA's all-reduce).
            switches = main_thread_switches(self._main_native_id)
            if switches is not None and self._switches is not None and switches - self._switches >= MOVE_SWITCHES:
                self._moved = True
            self._switches = switches
            cpu = time.process_time()
            span = max(now - self._activity_at, 1e-3)
            busy = (cpu - self._cpu) / span
            if evidence.runnable():  # a thread computing on a loaded machine: working, whatever its share
                busy = max(busy, 1.0)
            children_cpu, moved_bytes = evidence.sample()
            children_busy = max(children_cpu - self._children_cpu, 0.0) / span
            io = max(moved_bytes - self._moved_bytes, 0) / span
            self.send("activity", Activity(self.rank, time.time(), stack, int(self._moved), round(busy, 2),
                                           stacks.innermost_place(frames), round(children_busy, 2), round(io),
                                           None if self._moved else self._kind_of(stack, frames)))
            self._moved, self._cpu, self._activity_at = False, cpu, now
            self._children_cpu, self._moved_bytes = children_cpu, moved_bytes
            self._next_activity = now + ACTIVITY_SECONDS

    def _kind_of(self, stack: str, frames) -> str | None:
        """What the main thread does where it has stood still for a whole ACTIVITY_SECONDS: read
        once per place (the callee of the job's line needs its frame objects), then remembered."""
        if stack not in self._kinds:
            try:
                self._kinds[stack] = stacks.place(self.main_thread, frames)["kind"]
            except Exception:  # noqa: BLE001  (no kind: the watchdog falls back on the stacks' groups)
                self._kinds[stack] = None
            if len(self._kinds) > 1024:
                self._kinds.pop(next(iter(self._kinds)))
        return self._kinds[stack]

    def report_notice(self) -> None:
        """Tell the supervisor a notice reached this rank, even if the job then dies before it can
        stop (mpirun mode: Slurm's SIGTERM also ends mpirun)."""
        notice = preemption.NOTICE
        if notice.sources and not self.reported_notice and self.lost_at is None:
            self.reported_notice = True
            sources = notice.names(notice.sources)
            self.send("notice", NoticeSeen(self.rank, sources, notice.received))
            if sources != ["supervisor"]:  # the supervisor logged its own notice
                self.run.log_event("notice", source=",".join(sources), rank=self.rank, received=notice.received)

    def state(self, reason: str) -> dict:
        waiting = self.tracker.oldest_waiting()
        return {
            "rank": self.rank, "host": self.host, "pid": os.getpid(), "time": time.time(), "reason": reason,
            "collectives_started": self.tracker.count, "collectives_completed": self.tracker.completed(),
            "waiting_in": None if waiting is None else {"seq": waiting[0], "name": waiting[1],
                                                       "seconds": round(waiting[2], 3)},
            "where": stacks.where_is(self.main_thread),
            "place": stacks.place(self.main_thread),
            "main_thread": f"0x{self.main_thread:016x}",
        }

    def report_state(self, reason: str) -> None:
        """Dump every thread's stack into the log, then tell the supervisor where the main thread
        is (it writes logs/rank-N.state.json)."""
        header = f"\njaxlaunch: stacks of rank {self.rank} ({reason}); main thread 0x{self.main_thread:016x}\n"
        # Not faulthandler.dump_traceback(all_threads=True): from a thread, it can crash the rank
        # (see stacks.stack_of); faulthandler stays for crashes and SIGQUIT.
        os.write(self._dump_fd, (header + stacks.all_stacks()).encode("utf-8", "replace"))
        self.send("state", self.state(reason))

    def request_abort(self, reason, seq, name, waited, message, culprit=None) -> None:
        self.requested_abort = True
        self.send("abort", AbortRequest(
            self.rank, self.host, reason, message, time.time(),
            collective={"seq": seq, "name": name, "seconds": round(waited, 3)}, culprit=culprit))
