"""The hang watchdog: stop a job in which no rank has made progress, and name the rank that holds
it up; never stop a job whose ranks are working or waiting on something that will answer.

It needs no launcher collective. Progress is what the ranks report (`ctx.report`, sent by their
monitor threads every 0.2-2 s) and, for the many programs that never report, what each rank's
monitor says every ACTIVITY_SECONDS (launcher/rank/monitor.py, `activity`): whether its main
thread's stack moved, where it stands and what it does there (launcher/rank/stacks.py's kinds), its
own CPU, its descendants' CPU and the bytes it moved (launcher/rank/evidence.py). The supervisor
adds what it sees of the ranks' processes on its own machine: a stopped or dead one.

What counts as progress: a report; a rank entering or leaving a compile or a checkpoint; any
rank's stack moving. A stall is a time without any of these; which bound it gets depends on the
evidence, strongest first (`auto`'s figures; a number for hang_timeout replaces the split and
together bounds, and `JAXLAUNCH_WATCHDOG_SCALE` shrinks auto's for tests):

1. stopped: a rank's process is stopped (state T: SIGSTOP, a debugger, a frozen host) or dead
   (Z) while others are not: ended after STOPPED_SECONDS, that rank named.
2. silent: a rank stopped telling where it stands for SILENT_SECONDS (a stopped process on another
   host, C code holding the GIL): a culprit whatever phase it was in; ended after the split bound.
3. split: some ranks wait for their peers (in XLA, a collective, a barrier, MPI) and every other
   rank stands in its own code (or a checkpoint) using no CPU, doing no I/O, with no busy child:
   those are the culprits, ended after HANG_SPLIT_SECONDS (120 s); CHECKPOINT_FACTOR x in a
   checkpoint.
4. together: anything else: every rank at one place (one long XLA step, an evaluation on every
   rank), a rank computing alone, a rank waiting on its child, the network or a host callback,
   every rank waiting for a peer at different places. A job that never reported is ended after
   max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR x the longest stall that ended by itself); a job that
   reports after max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR x its slowest step).
Phases have bounds of their own, and none stops the clock for ever: a checkpoint save or restore
gets CHECKPOINT_FACTOR x; a compile whose stack stands still gets compile_limit() (a floor of
COMPILE_FLOOR_SECONDS, or COMPILE_FACTOR x the longest compile this attempt saw, at most
COMPILE_CEILING_SECONDS). A rank silent or stopped overrides any phase.

A culprit verdict waits while a rank's activity is overdue (not yet silent): a stopped rank's last
word must not make a healthy rank look apart. Ranks are never told apart by their number. The
roll-call at the stop (rollcall.py) reads the same kinds, so the stop line and failure.json agree.

The clock is the supervisor's own (monotonic, at the message's arrival), so ranks on other hosts
with skewed clocks cannot fool it; ranks send every 2 s, the resolution it works at.
"""

from __future__ import annotations

import os
import threading
import time

from collections import Counter

from ..spec.model import AUTO, HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS, HANG_STEP_FACTOR

CHECKPOINT_FACTOR = 4
SCALE_ENV = "JAXLAUNCH_WATCHDOG_SCALE"  # tests only: auto's stall bounds times this
BUSY = 0.5  # CPU seconds per second (the rank's, or its children's): working, not stalled
IO_BYTES_PER_SECOND = 64 * 1024  # bytes moved per second: a write, a read or an upload under way
SILENT_SECONDS = 10.0  # a rank whose activity stopped coming this long ago is frozen: not busy, a culprit
OVERDUE_SECONDS = 5.0  # activity this late (ranks send every 2 s) may be a rank going silent
STOPPED_SECONDS = 5.0  # a rank's process stopped (T) or dead (Z) this long, while others are not
COMPILE_FLOOR_SECONDS = 1800  # a compile whose stack stands still (XLA's C++ passes, autotuning)
COMPILE_FACTOR = 4  # times the longest compile this attempt saw
COMPILE_CEILING_SECONDS = 7200
COMPILING, CHECKPOINT = "compiling", "checkpoint"
WAITING_KINDS = ("xla", "collective", "barrier", "mpi4jax", "mpi")  # as launcher/rank/stacks.py
ELSEWHERE_KINDS = ("child", "network", "callback")
KIND_WORDS = {"own": "in its own code", "checkpoint": "in a checkpoint", "compiling": "compiling",
              "child": "waiting on its child process", "network": "waiting on the network",
              "callback": "in a host callback", None: "standing"}


def working(entry: dict) -> bool:
    """A rank that uses CPU, moves bytes, or has a busy child is working, wherever it stands."""
    return (entry.get("busy", 0.0) >= BUSY or entry.get("children_busy", 0.0) >= BUSY
            or entry.get("io", 0.0) >= IO_BYTES_PER_SECOND)


def stand_apart(stacks: dict[int, dict]) -> tuple[list[int], bool]:
    """(the ranks that hold the others up, whether the evidence is strong enough for the split
    bound). The ranks waiting for their peers are those in a waiting kind (XLA, a collective, a
    barrier, MPI), whatever their CPU (an MPI wait spins); the others are apart. It is the split
    shape when some rank waits and every rank apart stands in its own code or a checkpoint with no
    evidence of work (no CPU, no I/O, no busy child). A rank waiting on its child, the network or a
    host callback is apart but not proven stuck. Without kinds (a rank of an older jaxlaunch), the
    largest group of ranks at one stack waits, and only a strictly largest one; never a rank's number."""
    if not stacks:
        return [], False
    kinds = {rank: entry.get("kind") for rank, entry in stacks.items()}
    if any(kind is not None for kind in kinds.values()):
        waiting = {rank for rank, kind in kinds.items() if kind in WAITING_KINDS}
    else:
        groups = Counter(entry["stack"] for entry in stacks.values())
        sizes = sorted(groups.values(), reverse=True)
        if len(groups) < 2 or sizes[0] == sizes[1]:
            return [], False
        largest = max(groups, key=groups.get)
        waiting = {rank for rank, entry in stacks.items() if entry["stack"] == largest}
    apart = sorted(set(stacks) - waiting)
    if not waiting or not apart:
        return apart if waiting else [], False
    # A rank whose last word had no kind was moving then: not yet known to stand anywhere.
    known = any(kind is not None for kind in kinds.values())
    strong = all((kinds[r] in ("own", CHECKPOINT) or not known) and not working(stacks[r]) for r in apart)
    return apart, strong


def format_seconds(seconds: float) -> str:
    seconds = round(seconds)
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0 and seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def suggested_timeout(waited: float) -> str:
    """A hang_timeout value that would have let a wait of `waited` seconds run on: whole minutes,
    at least twice the wait, in the spec's own duration syntax."""
    minutes = max(5, -(-2 * waited // 60))
    return f"{int(minutes // 60)}h{int(minutes % 60)}m" if minutes >= 60 and minutes % 60 else (
        f"{int(minutes // 60)}h" if minutes >= 60 else f"{int(minutes)}m")


def describe_setting(hang_timeout) -> str:
    """What `hang_timeout` means, for explain and the supervisor's start line."""
    compiling = (f"a compile that stands still gets {format_seconds(COMPILE_FLOOR_SECONDS)} "
                 f"(or {COMPILE_FACTOR}x the longest so far)")
    culprit = (f"a rank stopped {format_seconds(STOPPED_SECONDS)} or silent {format_seconds(SILENT_SECONDS)} "
               f"is a culprit")
    if hang_timeout is None:
        return "off (hang_timeout: null)"
    if hang_timeout == AUTO:
        return (f"auto: {format_seconds(HANG_SPLIT_SECONDS)} when the ranks stall apart (a culprit), "
                f"else max({format_seconds(HANG_FLOOR_SECONDS)}, {HANG_STEP_FACTOR}x the slowest step so far); "
                f"a checkpoint save or restore gets {CHECKPOINT_FACTOR}x; {compiling}; {culprit}")
    return (f"{format_seconds(hang_timeout)}; a checkpoint save or restore gets "
            f"{format_seconds(CHECKPOINT_FACTOR * hang_timeout)}; {compiling}; {culprit}")


class HangWatchdog:
    """Fed by the control server's thread (`progress`, `phase`, `activity`, `finish`) and the
    supervisor's loop (`process_states`), asked by that loop (`check`). One per attempt."""

    def __init__(self, hang_timeout, clock=time.monotonic, size: int = 0):
        self.hang_timeout = hang_timeout
        self.clock = clock
        self.size = size               # ranks in the job: stacks are judged once each has spoken
        # Tests shrink the automatic bounds (minutes) to seconds; never set in a real job.
        self.scale = float(os.environ.get(SCALE_ENV, "1") or 1)
        self.stacks: dict[int, dict] = {}  # rank -> its last activity: stack, where, kind, evidence
        self.finished: set[int] = set()    # ranks whose entrypoint returned
        self.last_move: float | None = None  # when a rank's stack last moved (or a report came)
        self.first_heard: float | None = None  # the first activity of any rank
        self.longest_still = 0.0       # the longest time no stack moved, that ended by itself
        self.reported = False          # a report arrived in this attempt
        self.last_activity: float | None = None  # a report, or a rank entering or leaving a phase
        self.slowest_step = 0.0        # seconds, the longest interval between two reports seen
        self.phases: dict[int, str] = {}  # rank -> compiling | checkpoint, while it is in one
        self._phase_since: dict[int, float] = {}  # rank -> when it entered its phase
        self.longest_compile = 0.0     # the longest compile that ended, this attempt
        self.stopped: dict[int, tuple[str, float]] = {}  # rank -> (state T/t/Z, since when)
        self.verdict: dict | None = None  # the last hang found: rule, culprits
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
        """A rank's stack and evidence, every ACTIVITY_SECONDS (launcher/channel.py's Activity)."""
        with self._lock:
            now = self.clock()
            self.first_heard = self.first_heard or now
            before = self.stacks.get(rank)
            moved_at = before["moved_at"] if before is not None else now
            if message.get("moved") or before is None or before["stack"] != message.get("stack"):
                # The job's stall ends when any rank moves: the longest one learned is the job's.
                if self.last_move is not None:
                    self.longest_still = max(self.longest_still, now - self.last_move)
                self.last_move = moved_at = now
            self.stacks[rank] = {"stack": message.get("stack"), "where": message.get("where"),
                                 "busy": message.get("busy") or 0.0, "children_busy": message.get("children_busy") or 0.0,
                                 "io": message.get("io") or 0.0, "kind": message.get("doing"),
                                 "moved_at": moved_at, "at": now}

    def finish(self, rank: int) -> None:
        """The rank's entrypoint returned: its stack no longer stands anywhere."""
        with self._lock:
            self.finished.add(rank)
            self.stacks.pop(rank, None)

    def phase(self, rank: int, phase: str | None) -> None:
        with self._lock:
            now = self.clock()
            if self.phases.get(rank) == COMPILING and phase != COMPILING:
                self.longest_compile = max(self.longest_compile, now - self._phase_since.get(rank, now))
            if phase is None:
                self.phases.pop(rank, None)
            elif self.phases.get(rank) != phase:
                self.phases[rank] = phase
                self._phase_since[rank] = now
            self.last_activity = now

    # --- fed by the supervisor's loop --------------------------------------------------------

    def process_states(self, states: dict[int, str | None]) -> None:
        """rank -> its process's state letter, for the ranks on the supervisor's machine."""
        with self._lock:
            now = self.clock()
            for rank, state in states.items():
                if state in ("T", "t", "Z"):
                    if self.stopped.get(rank, ("", 0.0))[0] != state:
                        self.stopped[rank] = (state, now)
                else:
                    self.stopped.pop(rank, None)

    # --- asked by the supervisor ------------------------------------------------------------

    def limit(self) -> float | None:
        """The limit in force now for a job that reports, in seconds (None: off)."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout == AUTO:
            return max(float(HANG_FLOOR_SECONDS), HANG_STEP_FACTOR * self.slowest_step)
        return float(self.hang_timeout)

    def compile_limit(self) -> float:
        """How long a compile may stand still: its floor, or COMPILE_FACTOR x the longest compile
        seen, at most the ceiling (or CHECKPOINT_FACTOR x a larger hang_timeout)."""
        fixed = CHECKPOINT_FACTOR * float(self.hang_timeout) if self.hang_timeout not in (None, AUTO) else 0.0
        ceiling = max(COMPILE_CEILING_SECONDS * self.scale, fixed)
        return min(ceiling, max(COMPILE_FLOOR_SECONDS * self.scale, COMPILE_FACTOR * self.longest_compile, fixed))

    def check(self) -> str | None:
        """Why the job is hung, or None."""
        if self.hang_timeout is None:
            return None
        return self._check_stopped() or self._check_reports() or self._check_stacks()

    def stall_limits(self) -> tuple[float, float] | None:
        """(split, together): the stall allowed when idle ranks stand apart from ranks that wait
        for them, and otherwise. None: off."""
        if self.hang_timeout is None:
            return None
        if self.hang_timeout != AUTO:
            return float(self.hang_timeout), float(self.hang_timeout)
        together = max(HANG_FLOOR_SECONDS, HANG_STEP_FACTOR * max(self.longest_still, self.slowest_step)) * self.scale
        return HANG_SPLIT_SECONDS * self.scale, together

    def _found(self, rule: str, culprits: list[int], message: str) -> str:
        self.verdict = {"rule": rule, "culprits": culprits}
        return message

    def _check_stopped(self) -> str | None:
        with self._lock:
            now = self.clock()
            running = set(range(self.size)) - self.finished
            stopped = {r: v for r, v in self.stopped.items() if r in running}
            if not stopped or set(stopped) >= running:  # the whole job suspended on purpose (SIGTSTP)
                return None
            due = sorted(r for r, (_, since) in stopped.items() if now - since >= STOPPED_SECONDS)
            if not due:
                return None
            where = {r: self.stacks[r]["where"] for r in due if r in self.stacks}
        names = ", ".join(f"rank {r} ({'stopped' if stopped[r][0] in 'Tt' else 'dead, not reaped'}"
                          f"{', last at ' + where[r] if r in where else ''})" for r in due[:4])
        return self._found("stopped", due, f"{names}: its process has been {'stopped' if stopped[due[0]][0] in 'Tt' else 'a zombie'} "
                           f"for {STOPPED_SECONDS:.0f} s or more (state {stopped[due[0]][0]}: SIGSTOP, a debugger, "
                           f"a frozen host), while the other ranks run (rule: stopped)")

    def _check_reports(self) -> str | None:
        limit = self.limit()
        with self._lock:
            phases = set(self.phases.values())
            last = self.last_activity
            if limit is None or last is None:
                return None
            in_checkpoint = CHECKPOINT in phases
            if not self.reported and not in_checkpoint:
                return None  # start-up: before the first report
            allowed = limit * (CHECKPOINT_FACTOR if in_checkpoint else 1)
            if COMPILING in phases:
                allowed = max(allowed, self.compile_limit())
            idle = self.clock() - last
        if idle <= allowed:
            return None
        key = f"set hang_timeout: {suggested_timeout(idle)} in the spec if the job is meant to go this long without a report"
        if COMPILING in phases:
            return self._found("compiling", [], f"no rank made progress for {idle:.0f} s while compiling, past the "
                               f"compile's bound ({format_seconds(allowed)}; rule: compiling); {key}")
        if in_checkpoint:
            return self._found("checkpoint", [], f"no rank made progress for {idle:.0f} s; a rank is in a checkpoint "
                               f"save or restore, which gets {CHECKPOINT_FACTOR}x hang_timeout "
                               f"({format_seconds(allowed)}; rule: reports); {key}")
        setting = f"auto, {format_seconds(allowed)} now" if self.hang_timeout == AUTO else format_seconds(allowed)
        suspects = self._suspects()
        named = f"; {', '.join(f'rank {r}' for r in suspects[:4])} stopped or stopped telling" if suspects else ""
        return self._found("reports", suspects, f"no rank made progress for {idle:.0f} s (hang_timeout: {setting}; "
                           f"rule: reports){named}; {key}")

    def _suspects(self) -> list[int]:
        """The ranks whose process was seen stopped, or whose activity is late, when not every rank's
        is: a stall of the reports names them (the drill's short hang_timeout comes before the
        stopped and silent rules' own bounds)."""
        with self._lock:
            now = self.clock()
            running = set(range(self.size)) - self.finished
            late = {r for r, e in self.stacks.items() if r in running and now - e["at"] >= OVERDUE_SECONDS}
            found = {r for r in self.stopped if r in running} | late
        return sorted(found) if found and found != running else []

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
            idle = now - max(self.last_move, self.last_activity or 0.0)
            late = {r: now - e["at"] for r, e in self.stacks.items()}
            silent = sorted({*unheard, *(r for r, age in late.items() if age >= SILENT_SECONDS)})
            if len(silent) == len(running) and not self.finished:
                silent = []  # nobody tells: the channel's fault, not the ranks'
            overdue = [r for r, age in late.items() if OVERDUE_SECONDS <= age < SILENT_SECONDS]
            # A rank silent where it last waited for a peer is most likely still waiting there, in an
            # MPI call that keeps the GIL while it polls (mpi4py's pickled collectives do): it waits;
            # the culprit is the rank its peers wait for. Any other silent rank uses no CPU that
            # counts and stands nowhere it named.
            silent_waiting = {r for r in silent if (self.stacks.get(r) or {}).get("kind") in WAITING_KINDS}
            silent = [r for r in silent if r not in silent_waiting]
            stacks = {r: {**e, "busy": 0.0, "children_busy": 0.0, "io": 0.0, "kind": None} if r in silent else e
                      for r, e in self.stacks.items()}
            phases = {r: p for r, p in self.phases.items() if r in running and r not in silent}
            reported = self.reported
            compile_limit = self.compile_limit()
        split, together = limits
        auto = "auto, " if self.hang_timeout == AUTO else ""
        judged = {r: e for r, e in stacks.items() if r in running}
        assumed_waiting: set[int] = set()
        if silent:
            # A rank that tells, idle in its own code while others wait, is a culprit by what it says;
            # a silent (or late) one beside it may be polling in MPI with the GIL held (its last word
            # was before), as a whole group of ranks in mpi4py's allreduce is.
            quiet = {*silent, *overdue}
            talking = {r: e for r, e in judged.items() if r not in quiet}
            apart, strong = stand_apart({**talking, **{r: {**judged[r], "kind": "mpi"} for r in quiet if r in judged}})
            if strong and any(r not in silent for r in apart):
                assumed_waiting, silent = set(silent), []
        if silent and idle > split:  # overrides any phase: a frozen compile is still frozen
            names = ", ".join(f"rank {r} (last at {stacks[r]['where']})" if r in stacks else f"rank {r} (never told)"
                              for r in silent[:4])
            return self._found("silent", silent, (
                f"no rank made progress for {idle:.0f} s, and {names} stopped telling where it stands (a stopped "
                f"process, or C code holding the GIL) (hang_timeout: {auto}{format_seconds(split)} for a stall with "
                f"a culprit; rule: silent)"))
        if overdue:
            return None  # a rank may be going silent: its last word must not decide who is apart
        if COMPILING in phases.values():
            if idle <= compile_limit:
                return None
            compiling = sorted(r for r, p in phases.items() if p == COMPILING)
            return self._found("compiling", compiling, (
                f"no rank made progress for {idle:.0f} s, rank(s) {', '.join(map(str, compiling[:4]))} compiling "
                f"with a stack that stands still, past the compile's bound ({format_seconds(compile_limit)}: "
                f"{COMPILE_FACTOR}x the longest compile so far, at least {format_seconds(COMPILE_FLOOR_SECONDS * self.scale)}; "
                f"rule: compiling)"))
        factor = CHECKPOINT_FACTOR if CHECKPOINT in phases.values() else 1
        judged = {r: {**e, "kind": "mpi"} if r in assumed_waiting else e for r, e in judged.items()}
        apart, strong = stand_apart(judged)
        if strong and idle > split * factor:
            where = "; ".join(f"rank {r} {KIND_WORDS.get(judged[r]['kind'], 'in its own code')} at {judged[r]['where']}"
                              for r in apart[:4])
            more = f" and {len(apart) - 4} more" if len(apart) > 4 else ""
            waiting = [r for r in judged if r not in apart]
            return self._found("split", apart, (
                f"no rank made progress for {idle:.0f} s, and the ranks stand apart: {where}{more}, using no CPU, "
                f"doing no I/O and with no busy child, while {len(waiting)} rank(s) wait for them at "
                f"{judged[waiting[0]]['where']} (hang_timeout: {auto}{format_seconds(split * factor)} for a stall "
                f"with a culprit; rule: split); set hang_timeout: {suggested_timeout(idle)} in the spec if "
                f"{'this rank is' if len(apart) == 1 else 'these ranks are'} meant to wait this long"))
        if idle > together * factor and not reported:  # a job that reports: _check_reports's bound
            return self._found("together", [], (
                f"no rank made progress for {idle:.0f} s, {self._together_words(judged, apart)} (hang_timeout: "
                f"{auto}{format_seconds(together * factor)}; rule: together); set hang_timeout: "
                f"{suggested_timeout(idle)} in the spec if the job is meant to stand still this long"))
        return None

    @staticmethod
    def _together_words(stacks: dict[int, dict], apart: list[int]) -> str:
        if len({e["stack"] for e in stacks.values()}) <= 1:
            return "every rank standing still at one place"
        if apart and len(apart) < len(stacks):
            named = "; ".join(f"rank {r} {KIND_WORDS.get(stacks[r]['kind'], 'in its own code')} at {stacks[r]['where']}"
                              f"{' (working)' if working(stacks[r]) else ''}" for r in apart[:4])
            return f"every rank standing still; apart from the ranks that wait: {named}"
        if all(e.get("kind") in WAITING_KINDS for e in stacks.values()):
            return "every rank standing still, each waiting for a peer at a different place"
        return "every rank standing still, none waiting for a peer"

    def last_moved(self) -> dict[int, float]:
        """rank -> seconds since its stack last moved or it reported, as the watchdog sees it."""
        with self._lock:
            now = self.clock()
            return {rank: round(now - entry["moved_at"], 1) for rank, entry in self.stacks.items()}
