"""The hang watchdog: stop a job in which no rank has made progress for `hang_timeout`.

It needs no launcher collective: progress is what the ranks report (`ctx.report`, which their
monitor threads send every 0.2-2 s), so a job whose ranks all wait inside XLA's own collectives
(a global mesh: gloo on CPU, NCCL on GPU), in a barrier or behind a rank stuck in its data loader
is seen as hung as surely as one stuck in `launcher.allreduce`.

- Start-up is not counted: the watchdog is armed at the attempt's first report (a job that never
  reports keeps the behaviour of `timeout` and `collective_timeout` alone; the supervisor says so).
- Compiling is not counted: while any rank's main thread traces, lowers or compiles (its monitor
  says so: launcher/rank/stacks.py), the clock stands, and it restarts when the compile ends.
- A checkpoint save or restore gets CHECKPOINT_FACTOR times the limit, and arms the watchdog even
  before the first report (a restore at start-up that never returns is a hang too).
- `hang_timeout: auto` (the default) is max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR x the slowest
  interval between two reports seen so far): generous, so that a healthy job never meets it.

The clock is the supervisor's own (monotonic, at the message's arrival), so ranks on other hosts
with skewed clocks cannot fool it; ranks other than 0 send every 2 s, the resolution it works at.
"""

from __future__ import annotations

import threading
import time

from ..spec.model import AUTO, HANG_FLOOR_SECONDS, HANG_STEP_FACTOR

CHECKPOINT_FACTOR = 4
COMPILING, CHECKPOINT = "compiling", "checkpoint"


def format_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def describe_setting(hang_timeout) -> str:
    """What `hang_timeout` means, for explain and the supervisor's start line."""
    if hang_timeout is None:
        return "off (hang_timeout: null)"
    if hang_timeout == AUTO:
        return (f"auto: max({format_seconds(HANG_FLOOR_SECONDS)}, {HANG_STEP_FACTOR}x the slowest step so far); "
                f"a checkpoint save or restore gets {CHECKPOINT_FACTOR}x; compiling is not counted")
    return (f"{format_seconds(hang_timeout)}; a checkpoint save or restore gets "
            f"{format_seconds(CHECKPOINT_FACTOR * hang_timeout)}; compiling is not counted")


class HangWatchdog:
    """Fed by the control server's thread (`progress`, `phase`), asked by the supervisor's loop
    (`check`). One per attempt."""

    def __init__(self, hang_timeout, clock=time.monotonic):
        self.hang_timeout = hang_timeout
        self.clock = clock
        self.reported = False          # a report arrived in this attempt
        self.last_activity: float | None = None  # a report, or a rank entering or leaving a phase
        self.slowest_step = 0.0        # seconds, the longest interval between two reports seen
        self.phases: dict[int, str] = {}  # rank -> compiling | checkpoint, while it is in one
        self._last_report_time: dict[int, float] = {}  # rank -> the time (rank's clock) of its last report
        self._lock = threading.Lock()

    # --- fed by the control server ---------------------------------------------------------

    def progress(self, rank: int, message: dict) -> None:
        """A rank's progress message (launcher/rank/progress.py): reports since its last one."""
        if message.get("step") is None:
            return  # collective arrival times only: not a report
        with self._lock:
            self.reported = True
            self.last_activity = self.clock()
            seconds = message.get("step_seconds")
            if isinstance(seconds, (int, float)) and seconds > self.slowest_step:
                self.slowest_step = float(seconds)
            times = [r.get("time") for r in message.get("reports") or [] if isinstance(r.get("time"), (int, float))]
            if not times and isinstance(message.get("time"), (int, float)):
                times = [message["time"]]
            previous = self._last_report_time.get(rank)
            for at in times:
                if previous is not None and at - previous > self.slowest_step:
                    self.slowest_step = at - previous
                previous = at
            if previous is not None:
                self._last_report_time[rank] = previous

    def phase(self, rank: int, phase: str | None) -> None:
        with self._lock:
            if phase is None:
                self.phases.pop(rank, None)
            else:
                self.phases[rank] = phase
            self.last_activity = self.clock()

    # --- asked by the supervisor ------------------------------------------------------------

    def limit(self) -> float | None:
        """The limit in force now, in seconds (None: off)."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout == AUTO:
            return max(float(HANG_FLOOR_SECONDS), HANG_STEP_FACTOR * self.slowest_step)
        return float(self.hang_timeout)

    def check(self) -> str | None:
        """Why the job is hung, or None."""
        limit = self.limit()
        with self._lock:
            phases = set(self.phases.values())
            last = self.last_activity
            if limit is None or last is None or COMPILING in phases:
                return None
            in_checkpoint = CHECKPOINT in phases
            if not self.reported and not in_checkpoint:
                return None  # start-up: before the first report
            allowed = limit * (CHECKPOINT_FACTOR if in_checkpoint else 1)
            idle = self.clock() - last
        if idle <= allowed:
            return None
        if in_checkpoint:
            return (f"no rank made progress for {idle:.0f} s; a rank is in a checkpoint save or restore, which gets "
                    f"{CHECKPOINT_FACTOR}x hang_timeout ({format_seconds(allowed)})")
        setting = f"auto, {format_seconds(allowed)} now" if self.hang_timeout == AUTO else format_seconds(allowed)
        return f"no rank made progress for {idle:.0f} s (hang_timeout: {setting})"
