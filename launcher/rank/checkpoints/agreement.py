"""What the ranks do together for their checkpoints (the base of `Checkpoints`): the collectives in
the caller's thread, each counted for the hang watchdog (launcher/rank/stacks.py reads a frame of
`_collective` as a wait for peers), and the writer's own, on a communicator of their own, polled with
sleeps in the background.
"""

from __future__ import annotations

import time


class RankAgreement:
    """The collectives of one run's checkpoints, over `comm` (None: one process) and, for the
    writer, `_commit_comm` (its clone, made by the first save): both set by `Checkpoints`."""

    @property
    def size(self) -> int:
        return 1 if self.comm is None else self.comm.Get_size()

    # --- collectives in the caller's thread, counted for the hang watchdog --------------------

    def _collective(self, call, *args, **kwargs):
        """call(*args, **kwargs) as one tracked collective: every rank makes the same calls, so the
        sequence numbers the watchdog compares stay the same on every rank."""
        from ..tracker import TRACKER

        seq = TRACKER.start("checkpoint")
        TRACKER.enter(seq, "checkpoint")
        try:
            return call(*args, **kwargs)
        finally:
            TRACKER.leave()

    def _bcast(self, value):
        return value if self.size == 1 else self._collective(self.comm.bcast, value, root=0)

    def _everyones(self, value) -> list:
        return [value] if self.size == 1 else self._collective(self.comm.allgather, value)

    def _agree(self, error: str | None) -> str | None:
        """The first rank's error, on every rank; None when every rank is fine."""
        return next((e for e in self._everyones(error) if e), None)

    # --- collectives in the writer, on their own communicator -----------------------------

    def _quietly(self, background: bool) -> None:
        """In the background, wait for every rank with sleeps: MPI's blocking calls spin a core."""
        comm = self._commit_comm
        if background and hasattr(comm, "Ibarrier"):
            request, pause = comm.Ibarrier(), 0.0005
            while not request.Test():
                time.sleep(pause)
                pause = min(pause * 2, 0.02)

    def _commit_bcast(self, value, background: bool):
        if self.size == 1:
            return value
        self._quietly(background)
        return self._commit_comm.bcast(value, root=0)

    def _commit_gather(self, value, background: bool) -> list:
        if self.size == 1:
            return [value]
        self._quietly(background)
        return self._commit_comm.gather(value, root=0)

