"""`ctx.report(step, total=..., **metrics)`: the job says how far it has got.

The call only appends to a list (no collective, no I/O, no device sync: a jax scalar is kept as it
is and converted later, step included: a NumPy or JAX step becomes a Python int in `take`). Every FLUSH_SECONDS the rank's monitor thread (monitor.py) takes what
was reported and sends it to the supervisor over the control channel (rank 0 every 0.2 s), which appends it to
RUN_DIR/metrics.jsonl (launcher/rundir/metrics.py): rank 0's metrics, one line per report, and each rank's
step time, one line per rank per flush. The rest is flushed when main returns. Lines are appended,
so they survive restarts and requeues; the user side reads them (launcher/rundir/metrics.py).
"""

from __future__ import annotations

import time
from collections import deque

from .drill_fault import hang_in_the_programs_place, planted_hang

FLUSH_SECONDS = 2.0
CHUNK = 1000  # reports per message: a job reporting very fast still sends lines the supervisor takes


def plain(value):
    """A metric as JSON: numbers, strings, bools; a one-element array as its number; else its repr."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    try:
        import numpy as np

        array = np.asarray(value)  # a jax array: waits for it here, in the monitor thread
        if array.size == 1:
            return array.item()
        if array.size <= 16:
            return array.tolist()
    except Exception:  # noqa: BLE001  (a metric must never take the rank down)
        pass
    return repr(value)


def plain_number(value):
    """A step or total as a Python int (a float if it is not whole): NumPy and JAX integers, 0-d
    arrays and one-element arrays become JSON numbers, not strings (a Flax TrainState.step is a JAX
    integer). Anything else is returned as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    number = plain(value)
    if isinstance(number, float) and number.is_integer():
        return int(number)
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else value


def _compile_seconds() -> float:
    from .compile_cache import COUNTER

    return round(COUNTER.compile_seconds, 3)


def _is_computed(value) -> bool:
    is_ready = getattr(value, "is_ready", None)
    if is_ready is None:
        return True
    try:
        return bool(is_ready())
    except Exception:  # noqa: BLE001  (a deleted or failed array: converting it will say so)
        return True


def _computed(report) -> bool:
    step, _, total, metrics = report
    return _is_computed(step) and _is_computed(total) and all(_is_computed(v) for v in (metrics or {}).values())


class ProgressReporter:
    """One per rank. `report` from the job's thread, `take` from the monitor thread."""

    def __init__(self, rank: int):
        self.rank = rank
        self.last_step = None
        self.total: int | None = None
        self.queued: deque = deque()  # reports not taken yet; append and popleft are thread-safe
        self._previous: tuple[int, float] | None = None  # (step, time) of the last report sent
        self.first: tuple[float, float] | None = None  # (time, seconds compiled by then) of the first report
        self.hang_at = planted_hang(rank)  # the drill's `repeat` fault (drill_fault.py); None normally

    def report(self, step: int, total: int | None = None, **metrics) -> None:
        if self.first is None:  # the start-up budget: when, and after how much compiling
            self.first = (time.time(), _compile_seconds())
        self.last_step = step  # where this rank was when it fails (its error record; the governor)
        if self.hang_at is not None and plain_number(step) == self.hang_at:
            hang_in_the_programs_place(self.hang_at)
        self.queued.append((step, time.time(), total, metrics if self.rank == 0 else None))

    def take(self, wait: bool = False) -> dict | None:
        """The 'progress' message for (at most CHUNK of) what was reported since the last call, or
        None; call again while `pending`."""
        # Rank 0 sends its reports (CHUNK at a time); the others only their step time.
        count = min(CHUNK, len(self.queued)) if self.rank == 0 else len(self.queued)
        # Only reports whose JAX values are computed: the monitor thread must never wait for a device
        # (a step stuck in a cross-process collective would leave it unable to answer a stop), and
        # a report counts as progress for the hang watchdog once its step has run.
        taken = []
        while len(taken) < count and self.queued and (wait or _computed(self.queued[0])):
            taken.append(self.queued.popleft())
        # Here, in the monitor thread, a JAX step becomes a Python number.
        reports = [(plain_number(step), at, total, metrics) for step, at, total, metrics in taken]
        if not reports:
            return None
        for _, _, total, _ in reports:
            if total is not None:
                self.total = int(plain_number(total))
        step, at = reports[-1][0], reports[-1][1]
        first_step, first_at = self._previous or (reports[0][0], reports[0][1])
        self._previous = (step, at)
        steps = step - first_step
        message = {"step": step, "time": at, "total": self.total,
                   "step_seconds": (at - first_at) / steps if steps > 0 else None}
        if self.rank == 0:
            message["reports"] = [{"step": s, "time": t, "metrics": {k: plain(v) for k, v in m.items()}}
                                  for s, t, _, m in reports]
        return message

    @property
    def pending(self) -> bool:
        """Reports that can be taken now (not ones still waiting for their device values)."""
        return bool(self.queued) and _computed(self.queued[0])
