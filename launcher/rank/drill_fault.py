"""The drill's `repeat` fault, inside the rank: the program's own hang, at the same step on every
attempt, as a loader that blocks on a bad shard would. The drill cannot stop a rank from outside at
exactly one step (it polls the reports), so it names the rank and step in JAXLAUNCH_DRILL_HANG
("RANK:STEP") and that rank's `ctx.report(STEP)` never returns. The hang watchdog stops the job; the
governor (supervisor/governor.py) must then see the second hang at the same place and not try a
third time. Nothing happens without the variable."""

from __future__ import annotations

import os
import threading

HANG_ENV = "JAXLAUNCH_DRILL_HANG"


def planted_hang(rank: int, env=os.environ) -> int | None:
    """The step at which this rank is to hang, or None."""
    value = env.get(HANG_ENV, "")
    who, sep, step = value.partition(":")
    if not sep or not who.strip().isdigit() or not step.strip().lstrip("-").isdigit():
        return None
    return int(step) if int(who) == rank else None


def hang_in_the_programs_place(step: int) -> None:
    """Block forever, alive, where the program reported `step` (the roll-call names this frame)."""
    threading.Event().wait()
