"""The slow rank, named: which rank arrives last at the launcher's collectives, persistently.

Every rank's tracker notes when it arrived at each launcher collective (time.time(); the hot path
gains one clock read and one list store). Its monitor sends those times with its progress every
2 s; the supervisor's control server puts the ranks' times for each collective side by side here.
A rank that is slow but alive (a throttled GPU, a bad link, a noisy neighbour) arrives last, and
late, at nearly every collective that waits for someone (a step's first collective, say; the next
ones find every rank together); with no slow rank, who arrives late varies. Of the last WINDOW
complete collectives, those whose last rank came MIN_LATE_SECONDS or more after the others' median
waited: the rank that made the others wait longest in all is named when it was last at
LAST_FRACTION or more of those (at least MIN_COLLECTIVES) whose wait was at least TYPICAL_SHARE of
its own typical (median) wait.
Across nodes the comparison relies on the nodes' clocks agreeing (NTP: about a millisecond).
"""

from __future__ import annotations

import statistics
from collections import Counter, deque

WINDOW = 500
MIN_COLLECTIVES = 20
LAST_FRACTION = 0.9
MIN_LATE_SECONDS = 0.005
TYPICAL_SHARE = 0.5  # a wait shorter than this share of the slow rank's typical wait is noise
KEEP_PENDING = 2048  # collectives waiting for some rank's times; older ones are dropped


class Stragglers:
    def __init__(self, size: int):
        self.size = size
        self._pending: dict[int, dict[int, float]] = {}
        self._recent: deque = deque(maxlen=WINDOW)  # (last rank, seconds after the others' median)

    def add(self, rank: int, first: int, times: list[float]) -> None:
        """Rank `rank` arrived at collectives first, first+1, ... at `times`."""
        if self.size < 2:
            return
        for offset, arrived in enumerate(times):
            seq = first + offset
            seen = self._pending.setdefault(seq, {})
            seen[rank] = arrived
            if len(seen) == self.size:
                del self._pending[seq]
                self._complete(seen)
        if len(self._pending) > KEEP_PENDING:
            for seq in sorted(self._pending)[:len(self._pending) - KEEP_PENDING]:
                del self._pending[seq]

    def _complete(self, arrivals: dict[int, float]) -> None:
        ordered = sorted(arrivals.items(), key=lambda item: item[1])
        last_rank, last_time = ordered[-1]
        others = statistics.median(t for _, t in ordered[:-1])
        self._recent.append((last_rank, last_time - others))

    def verdict(self) -> dict | None:
        """{'rank', 'fraction', 'collectives', 'late_seconds'} for a persistently slow rank, or None.

        The candidate is the rank that kept the others waiting longest in all. A slow rank's waits are
        alike (its extra time per step); another rank's scheduling hiccups are mostly shorter, and a
        wait under TYPICAL_SHARE of the candidate's typical one does not count against it: on a busy
        2-core machine the other rank of a job whose rank 1 slept 50 ms a step came last, 5-18 ms
        late, at 20 of 101 waiting collectives, and no rank was named."""
        waited = [(rank, seconds) for rank, seconds in self._recent if seconds >= MIN_LATE_SECONDS]
        if len(waited) < MIN_COLLECTIVES:
            return None
        total = Counter()
        for rank, seconds in waited:
            total[rank] += seconds
        rank = total.most_common(1)[0][0]
        typical = statistics.median(seconds for r, seconds in waited if r == rank)
        counted = [r for r, seconds in waited if seconds >= TYPICAL_SHARE * typical]
        if len(counted) < MIN_COLLECTIVES:
            return None
        fraction = counted.count(rank) / len(counted)
        if fraction < LAST_FRACTION:
            return None
        return {"rank": rank, "fraction": round(fraction, 3), "collectives": len(counted),
                "window": len(self._recent), "late_seconds": round(typical, 4)}


def describe(verdict: dict, host: str | None = None) -> str:
    """'rank 5 (node3) arrived last at 98% of the 160 collectives that waited for a rank (of the last
    500), 85.0 ms after the others'"""
    where = f" ({host})" if host else ""
    return (f"rank {verdict['rank']}{where} arrived last at {100 * verdict['fraction']:.0f}% of the "
            f"{verdict['collectives']} collectives that waited for a rank (of the last {verdict['window']}), "
            f"{verdict['late_seconds'] * 1e3:.1f} ms after the others")
