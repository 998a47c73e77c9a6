"""Which launcher collectives this rank has started and which it still waits for: the hot path
of every launcher collective (a counter, a list store and an attribute store; blocking mpi4py calls
also read the clock), read by the monitor thread's watchdog (monitor.py)."""

from __future__ import annotations

import time


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
