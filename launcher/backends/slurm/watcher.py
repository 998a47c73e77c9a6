"""The batched watcher: one `SlurmWatcher` per process, through which every Slurm job handle asks
Slurm. It refreshes every job it follows with one batched query (squeue, then scontrol and sacct
for the rest: at most three commands however many jobs), less and less often while nothing
changes, as submitit's InfoWatcher does. A job whose supervisor has written its final state in
status.json needs no scheduler call at all (job.py).
"""

from __future__ import annotations

import threading
import time

from . import scheduler

MIN_REFRESH, MAX_REFRESH, BACKOFF = 1.0, 10.0, 1.5


class SlurmWatcher:
    """The scheduler's view of every job this process follows, refreshed in batches: one query
    for every unfinished job, at most every `interval` seconds. The interval starts at
    MIN_REFRESH and grows 1.5x after each refresh that changed nothing, up to MAX_REFRESH; a
    change brings it back down. A finished job is never asked about again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._followed: set[str] = set()
        self._infos: dict[str, scheduler.SlurmRecord | None] = {}
        self._last_refresh = float("-inf")
        self.interval = MIN_REFRESH

    def follow(self, job_id: str) -> None:
        """Include `job_id` in the next refresh (no I/O: handles call it when they are made)."""
        with self._lock:
            self._followed.add(job_id)

    def refresh(self, job_ids=()) -> None:
        """Ask Slurm now about `job_ids` and every unfinished job followed, in one batch."""
        with self._lock:
            self._followed.update(job_ids)
            self._refresh()

    def _refresh(self) -> None:
        wanted = sorted(j for j in self._followed if not (self._infos.get(j) and self._infos[j].finished))
        answers = scheduler.query_jobs(wanted) if wanted else {}
        changed = False
        for job_id in wanted:
            old, new = self._infos.get(job_id), answers.get(job_id)
            changed |= job_id not in self._infos or (old and old.slurm_state) != (new and new.slurm_state)
            self._infos[job_id] = new
            if new is None:
                self._followed.discard(job_id)  # unknown to Slurm: asked again only when asked for
        self.interval = MIN_REFRESH if changed else min(self.interval * BACKOFF, MAX_REFRESH)
        self._last_refresh = time.monotonic()

    def info(self, job_id: str, max_age: float | None = None) -> scheduler.SlurmRecord | None:
        """Slurm's view of `job_id`: asked now if it was never asked, if the refresh interval (or
        `max_age`) has passed, else what the last refresh said. None when Slurm does not know it."""
        with self._lock:
            self._followed.add(job_id)
            info = self._infos.get(job_id)
            age = time.monotonic() - self._last_refresh
            if job_id not in self._infos or info is None and max_age is not None:
                self._refresh()
            elif not (info is not None and info.finished) and age >= (self.interval if max_age is None else max_age):
                self._refresh()
            return self._infos.get(job_id)

    def last_known(self, job_id: str) -> scheduler.SlurmRecord | None:
        """What the last refresh said of `job_id` (None if never asked, or unknown); no I/O."""
        with self._lock:
            return self._infos.get(job_id)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._infos.pop(job_id, None)
            self._followed.discard(job_id)


WATCHER = SlurmWatcher()


def shared_watcher() -> SlurmWatcher:
    """The process's one watcher, WATCHER, looked up here at each call (each test swaps in a fresh one)."""
    return WATCHER
