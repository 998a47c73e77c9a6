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

Most programs never call ctx.report, and a stall in one that does may be the classic hang. So the
ranks' main-thread stacks are progress too: each rank's monitor says every 2 s whether its stack
moved, where it stands and how busy its process was (launcher/rank/monitor.py, `activity`). Once
every rank has spoken, a stall is a time in which no rank reported and no rank's stack moved:
- split: the ranks stand at different places and those apart from the largest group (the
  culprits) use no CPU (a loader stuck on a dead filesystem, a deadlock): ended after
  HANG_SPLIT_SECONDS (auto) or hang_timeout;
- every rank at one place (one long XLA execution, an evaluation, a long step) or a busy culprit:
  for a job that never reported, ended only after max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR x the
  longest stall that ended by itself) (auto) or hang_timeout; a job that reports has the bound of
  its reports.
Compiling stops the clock and a checkpoint gets CHECKPOINT_FACTOR times, as for reports.

The clock is the supervisor's own (monotonic, at the message's arrival), so ranks on other hosts
with skewed clocks cannot fool it; ranks other than 0 send every 2 s, the resolution it works at.
"""

from __future__ import annotations

import os
import threading
import time

from collections import Counter

from ..spec.model import AUTO, HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS, HANG_STEP_FACTOR

CHECKPOINT_FACTOR = 4
SCALE_ENV = "JAXLAUNCH_WATCHDOG_SCALE"  # tests only: auto's stall bounds times this
BUSY = 0.5  # CPU seconds per second: a rank that uses this much is working, not stalled
SILENT_SECONDS = 10.0  # a rank whose activity stopped coming this long ago is frozen: not busy, a culprit
COMPILING, CHECKPOINT = "compiling", "checkpoint"


def stand_apart(stacks: dict[int, dict]) -> tuple[list[int], bool]:
    """(the ranks apart from the others, whether the stall has the shape of a hang with a culprit).
    With a largest group of ranks at one place, the others are apart, and it is that shape when
    none of them is busy (a rank that computes alone, an evaluation on rank 0, is working). With no
    largest group (two ranks, two places), which side waits cannot be told from the stacks alone:
    it is that shape only when no rank is busy (the roll-call names the culprit afterwards)."""
    groups = Counter(entry["stack"] for entry in stacks.values())
    if len(groups) < 2:
        return [], False
    sizes = sorted(groups.values(), reverse=True)
    first_stack = {entry["stack"]: rank for rank, entry in sorted(stacks.items(), reverse=True)}
    waiting = max(groups, key=lambda stack: (groups[stack], -first_stack[stack]))
    apart = sorted(rank for rank, entry in stacks.items() if entry["stack"] != waiting)
    judged = apart if sizes[0] > sizes[1] else list(stacks)
    return apart, all(stacks[rank]["busy"] < BUSY for rank in judged)


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
        return (f"auto: {format_seconds(HANG_SPLIT_SECONDS)} when the ranks stall apart (a culprit), "
                f"else max({format_seconds(HANG_FLOOR_SECONDS)}, {HANG_STEP_FACTOR}x the slowest step so far); "
                f"a checkpoint save or restore gets {CHECKPOINT_FACTOR}x; compiling is not counted")
    return (f"{format_seconds(hang_timeout)}; a checkpoint save or restore gets "
            f"{format_seconds(CHECKPOINT_FACTOR * hang_timeout)}; compiling is not counted")


class HangWatchdog:
    """Fed by the control server's thread (`progress`, `phase`), asked by the supervisor's loop
    (`check`). One per attempt."""

    def __init__(self, hang_timeout, clock=time.monotonic, size: int = 0):
        self.hang_timeout = hang_timeout
        self.clock = clock
        self.size = size               # ranks in the job: stacks are judged once each has spoken
        # Tests shrink the automatic bounds (minutes) to seconds; never set in a real job.
        self.scale = float(os.environ.get(SCALE_ENV, "1") or 1)
        self.stacks: dict[int, dict] = {}  # rank -> its last activity: stack, where, busy
        self.finished: set[int] = set()    # ranks whose entrypoint returned
        self.last_move: float | None = None  # when a rank's stack last moved (or a report came)
        self.first_heard: float | None = None  # the first activity of any rank
        self.longest_still = 0.0       # the longest time no stack moved, that ended by itself
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

    def activity(self, rank: int, message: dict) -> None:
        """A rank's stack, every ACTIVITY_SECONDS (launcher/channel.py's Activity)."""
        with self._lock:
            now = self.clock()
            self.first_heard = self.first_heard or now
            before = self.stacks.get(rank)
            moved_at = before["moved_at"] if before is not None else now
            if message.get("moved") or before is None or before["stack"] != message.get("stack"):
                if self.last_move is not None:
                    self.longest_still = max(self.longest_still, now - self.last_move)
                self.last_move = moved_at = now
            self.stacks[rank] = {"stack": message.get("stack"), "where": message.get("where"),
                                 "busy": message.get("busy") or 0.0, "moved_at": moved_at, "at": now}

    def finish(self, rank: int) -> None:
        """The rank's entrypoint returned: its stack no longer stands anywhere."""
        with self._lock:
            self.finished.add(rank)
            self.stacks.pop(rank, None)

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
        return self._check_reports() or self._check_stacks()

    def stall_limits(self) -> tuple[float, float] | None:
        """(split, together): the stall allowed when the ranks stand apart with idle culprits, and
        when they stand together (or a culprit is busy). None: off."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout != AUTO:
            return float(self.hang_timeout), float(self.hang_timeout)
        together = max(HANG_FLOOR_SECONDS * self.scale, HANG_STEP_FACTOR * max(self.longest_still, self.slowest_step))
        return HANG_SPLIT_SECONDS * self.scale, together

    def _check_stacks(self) -> str | None:
        limits = self.stall_limits()
        with self._lock:
            now = self.clock()
            running = set(range(self.size)) - self.finished
            unheard = running - set(self.stacks)
            if limits is None or not running or self.last_move is None or self.first_heard is None:
                return None  # off, or nobody has said where it stands yet
            if unheard and now - self.first_heard < SILENT_SECONDS:
                return None  # start-up: not every rank has said where it stands yet
            phases = set(self.phases.values())
            if COMPILING in phases:
                return None
            factor = CHECKPOINT_FACTOR if CHECKPOINT in phases else 1
            idle = now - max(self.last_move, self.last_activity or 0.0)
            # A rank that stopped telling (SIGSTOPped, or holding the GIL in C), or never told, is frozen:
            # it uses no CPU that counts, and it is the culprit, unless nobody tells (the channel's fault).
            stacks = {rank: {**entry, "busy": entry["busy"] if now - entry["at"] < SILENT_SECONDS else 0.0}
                      for rank, entry in self.stacks.items()}
            silent = sorted({*unheard, *(r for r, e in self.stacks.items() if now - e["at"] >= SILENT_SECONDS)})
            if len(silent) == len(running) and not self.finished:
                silent = []
            reported = self.reported
        apart, idle_apart = stand_apart(stacks)
        split, together = limits
        auto = self.hang_timeout == AUTO
        if silent and idle > split * factor:  # a rank that cannot even say where it stands is the culprit
            names = ", ".join(f"rank {r} (last at {stacks[r]['where']})" if r in stacks else f"rank {r} (never told)"
                              for r in silent[:4])
            return (f"no rank made progress for {idle:.0f} s, and {names} stopped telling where it stands (a "
                    f"stopped process, or C code holding the GIL) (hang_timeout: {'auto, ' if auto else ''}"
                    f"{format_seconds(split * factor)} for a stall with a culprit)")
        if idle_apart and idle > split * factor:
            where = "; ".join(f"rank {r} at {stacks[r]['where']}" for r in apart[:4])
            rest = [r for r in stacks if r not in apart]
            return (f"no rank made progress for {idle:.0f} s, and the ranks stand apart: {where}, while "
                    f"{len(rest)} rank(s) wait at {stacks[rest[0]]['where']} (hang_timeout: "
                    f"{'auto, ' if auto else ''}{format_seconds(split * factor)} for a stall with a culprit)")
        if idle > together * factor and not reported:  # a job that reports: _check_reports's bound
            return (f"no rank made progress for {idle:.0f} s, every rank standing still (hang_timeout: "
                    f"{'auto, ' if auto else ''}{format_seconds(together * factor)})")
        return None

    def last_moved(self) -> dict[int, float]:
        """rank -> seconds since its stack last moved or it reported, as the watchdog sees it."""
        with self._lock:
            now = self.clock()
            return {rank: round(now - entry["moved_at"], 1) for rank, entry in self.stacks.items()}

    def _check_reports(self) -> str | None:
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
