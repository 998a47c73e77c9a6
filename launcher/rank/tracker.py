"""Which launcher collectives this rank has started and which it still waits for: the hot path
of every launcher collective (a counter, a list store and an attribute store; blocking mpi4py calls
also read the clock), read by the monitor thread's watchdog (monitor.py)."""

from __future__ import annotations

import time


class CollectiveTracker:
    """Which launcher collectives this rank has started, and which it still waits for.

    A collective is pending from start() until its output is known to be ready. The hot path
    only records: `start` bumps a counter and notes the name; `dispatched` keeps (seq, output) of
    the latest asynchronous (mpi4jax) call; a blocking call (mpi4py) is pending between enter()
    and leave(), and leave() marks its seq as handed over. Completion is worked out by the monitor
    thread alone: it keeps one (seq, output) snapshot, and once that output is ready every
    collective up to that seq has finished (a device runs its computations in order). A
    collective whose dispatch is still going on (its first call compiles; on the CPU it runs
    inline) has no output yet, so it stays pending; so does one still in flight when main returns.
    Every public collective counts once, so the sequence numbers agree across ranks.
    """

    NAMES = 256  # names kept for the last 256 collectives

    def __init__(self):
        self.count = 0
        self.names = [""] * self.NAMES
        # when this rank arrived at each of the last NAMES collectives (time.time()): which rank
        # arrives last, persistently, is the slow one (the supervisor compares; launcher/stragglers.py)
        self.arrivals = [0.0] * self.NAMES
        self.latest = None    # (seq, output) of the latest collective handed over; one store, so never torn
        self.blocking = None  # (seq, name, started) while inside a blocking MPI call
        self.blocking_timeout: float | None = None  # its own timeout (launcher.barrier(timeout=...))
        # the monitor thread's own state
        self.confirmed = 0    # every collective up to this one has finished
        self.snapshot = None  # (seq, output) taken at an earlier poll
        self._oldest = None   # (seq, first seen) of the oldest collective not known to be finished

    def start(self, name: str) -> int:
        self.count += 1
        self.names[self.count % self.NAMES] = name
        self.arrivals[self.count % self.NAMES] = time.time()
        return self.count

    def arrivals_since(self, seq: int) -> tuple[int, list[float]]:
        """(first seq, arrival times) of the collectives after `seq` still in the ring (monitor thread)."""
        count = self.count
        first = max(seq + 1, count - self.NAMES + 2)  # the newest slot may be written as we read
        return first, [self.arrivals[s % self.NAMES] for s in range(first, count + 1)]

    def dispatched(self, seq: int, name: str, handle) -> None:
        self.latest = (seq, handle)

    def enter(self, seq: int, name: str, timeout: float | None = None) -> None:
        self.blocking_timeout = timeout  # a barrier's own limit, read with `blocking`
        self.blocking = (seq, name, time.monotonic())

    def leave(self) -> None:
        blocking, self.blocking = self.blocking, None
        self.blocking_timeout = None
        if blocking is not None:
            self.done(blocking[0])

    def done(self, seq: int) -> None:
        """`seq` has nothing more to wait for on this side. It finishes with the asynchronous
        output before it (device work runs in order), so that output stays the one to watch."""
        latest = self.latest
        if latest is None or latest[0] < seq:
            self.latest = (seq, None if latest is None else latest[1])

    def name_of(self, seq: int) -> str:
        return self.names[seq % self.NAMES] if self.count - seq < self.NAMES else "collective"

    def observe(self) -> None:
        """Advance what is known to have finished (monitor thread only)."""
        latest = self.latest
        if self.snapshot is None and latest is not None and latest[0] > self.confirmed:
            self.snapshot = latest  # kept until ready, so a fast stream of collectives still confirms
        if self.snapshot is not None:
            seq, output = self.snapshot
            try:
                ready = output is None or output.is_ready()
            except Exception:  # noqa: BLE001  (a deleted buffer has finished too)
                ready = True
            if ready:
                self.confirmed = max(self.confirmed, seq)
                self.snapshot = None
        count = self.count
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
