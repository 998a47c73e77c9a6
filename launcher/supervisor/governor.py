"""Recovery that knows when to stop: a failure that repeats is the program's, not the node's.

Every attempt that does not complete is classified (`AttemptEnd`): the machine's (a node lost, a
failed health check, a preemption, a signal from outside, the job's time spent) or the program's
(an exception, a non-zero exit, a hang), with where it happened (the exception's type and the job's
innermost frame; the roll-call's culprits and their frames), the last step reported and the newest
checkpoint. The record goes to events.jsonl (`attempt_end`), so a requeued batch job, whose
supervisor is a new process, reads the attempt before its own.

The governor's one rule: an attempt that ends the program's way at the same place as the attempt
before, with no checkpoint written since, is not tried again, by a restart (max_restarts), a requeue
or a spare node; the job ends FAILED with the reason. A first failure still gets today's recovery,
and the machine's faults always do. The spec key `stop_repeated_failures: false` turns it off.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..rundir import RunDirectory
from ..states import Cause
from ..rundir.metrics import read_lines

PROGRAM_CAUSES = (Cause.EXCEPTION, Cause.EXIT, Cause.HANG)
# How a stop of the supervisor's own maps to a cause (None: the launcher exited on its own).
STOP_CAUSES = {Cause.HANG: Cause.HANG, Cause.COLLECTIVE_TIMEOUT: Cause.HANG, Cause.LEFT_EARLY: Cause.EXIT,
               Cause.TIMEOUT: Cause.TIMEOUT, Cause.CANCELLED: Cause.CANCELLED}
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@dataclass(frozen=True)
class AttemptEnd:
    attempt: int
    cause: Cause              # exception, exit, hang (the program's); node_failure, health_check, preemption,
                              # cancelled, timeout, failed (the machine's, or not known)
    where: str | None = None  # "ValueError at train.py:40 in step", "rank 1 in read_batch at hangs.py:30"
    step: int | None = None   # the last step the attempt completed (last_step)
    checkpoint: int | None = None  # the newest checkpoint step when it ended

    @property
    def programs(self) -> bool:
        return self.cause in PROGRAM_CAUSES


def classify(attempt: int, failure: dict | None, stop_reason: str | None, run: RunDirectory, since: float,
             machine_cause: Cause | None = None) -> AttemptEnd:
    """How attempt `attempt` (started at `since`) ended. `machine_cause`: the allocation's word when
    it lost nodes (node_failure) or the health check failed."""
    step, checkpoint = last_step(run, since), newest_checkpoint(run)
    if machine_cause is not None:
        return AttemptEnd(attempt, machine_cause, step=step, checkpoint=checkpoint)
    failure = failure or {}
    cause = STOP_CAUSES.get(stop_reason) if stop_reason else None
    where = None
    if cause == Cause.HANG:
        culprits = ((failure.get("hang") or {}).get("roll_call") or {}).get("culprits") or []
        where = "; ".join(f"rank {c.get('rank')} {c.get('where') or c.get('why') or ''}".strip()
                          for c in sorted(culprits, key=lambda c: c.get("rank", 0))) or None
    elif cause is None:
        first = failure.get("first_failure") or {}
        if isinstance(first.get("step"), int):
            step = first["step"]  # the failing rank's own last report: rank 0's may lag behind it
        kind = first.get("kind")
        cause = Cause.EXIT if kind == "exit" or (first.get("source") == "launcher" and first.get("signal") is None
                                                 and first.get("exit_code")) else Cause.EXCEPTION if kind else Cause.FAILED
        where = _place_of(first)
    return AttemptEnd(attempt, cause, where=where, step=step, checkpoint=checkpoint)


def _place_of(first: dict) -> str | None:
    """'ValueError at job.py:40 in step': the error's type and the innermost frame of its traceback."""
    error = (first.get("error") or "").split(":", 1)[0].strip() or None
    frames = _FRAME.findall(first.get("traceback") or "")
    frame = f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else None
    if error and frame:
        return f"{error} at {frame}"
    return error or frame


def last_step(run: RunDirectory, since: float) -> int | None:
    """The last step the attempt (started at `since`) completed: its last report, else the step
    before the one it restored (an attempt that hangs at once, where the one before hung, reports
    nothing)."""
    steps = [r["step"] for r in read_lines(run.metrics_file)
             if r.get("kind") == "metrics" and isinstance(r.get("step"), int) and r.get("time", 0) >= since]
    if steps:
        return max(steps)
    restored = [e["step"] for e in run.read_events()
                if e.get("event") == "restored" and isinstance(e.get("step"), int) and e.get("time", 0) >= since]
    return restored[-1] - 1 if restored else None


def newest_checkpoint(run: RunDirectory) -> int | None:
    steps = [e["step"] for e in run.read_events() if e.get("event") == "checkpoint" and isinstance(e.get("step"), int)]
    return max(steps) if steps else None


def previous_end(run: RunDirectory, before: int) -> AttemptEnd | None:
    """The record of the attempt before `before`, from events.jsonl (written by this supervisor or
    by the one of an earlier batch job)."""
    for event in reversed(run.read_events()):
        if event.get("event") == "attempt_end" and isinstance(event.get("attempt"), int) and event["attempt"] < before:
            fields = {k: event.get(k) for k in ("attempt", "cause", "where", "step", "checkpoint")}
            return AttemptEnd(**fields)
    return None


def record(run: RunDirectory, end: AttemptEnd) -> None:
    run.log_event("attempt_end", **asdict(end))


def repeated(previous: AttemptEnd | None, current: AttemptEnd) -> str | None:
    """Why not to try again (the program's own failure, twice at the same place, no checkpoint
    written between), or None."""
    if previous is None or not (previous.programs and current.programs):
        return None
    if (current.cause, current.where, current.step) != (previous.cause, previous.where, previous.step):
        return None
    if current.where is None and current.step is None:
        return None  # nothing says it is the same place
    newest_before = -1 if previous.checkpoint is None else previous.checkpoint  # step 0's is a checkpoint
    if current.checkpoint is not None and current.checkpoint > newest_before:
        return None  # it got further: the next attempt starts later
    at = f" after step {current.step}" if current.step is not None else ""
    return (f"the program's own {current.cause}, twice at the same place{at}: {current.where or 'the same step'} "
            f"(attempts {previous.attempt} and {current.attempt}, no checkpoint written between): not tried again")
