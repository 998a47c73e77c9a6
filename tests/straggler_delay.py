"""How much slower a planted slow rank must be to stand out from the machine's own noise (the Slurm
tier's straggler test): the spread of an even job's step times, measured now on this machine, times
a margin. A fixed 50 ms was named on an idle machine and not under a load average of 5-18, where
the others' steps varied by more than that."""

from __future__ import annotations

import statistics

FLOOR_SECONDS = 0.05   # the delay on a quiet machine (a throttled GPU's order of magnitude)
# launcher/stragglers.py ignores waits under half the slow rank's typical one (TYPICAL_SHARE): a
# delay of MARGIN times the others' usual deviation leaves their hiccups well under that half.
MARGIN = 4.0
CEILING_SECONDS = 2.0  # 60 steps of it are two minutes: a machine noisier than that tests nothing
WARM_UP_STEPS = 2      # the first steps compile


def step_seconds(report_times: list[float]) -> list[float]:
    """The seconds between consecutive reports (one report per step), the warm-up steps left out."""
    times = sorted(report_times)[WARM_UP_STEPS:]
    return [later - earlier for earlier, later in zip(times, times[1:])]


def spread(steps: list[float]) -> float:
    """How far a step usually strays from the median step: the 90th percentile of the deviations."""
    median = statistics.median(steps)
    deviations = sorted(abs(seconds - median) for seconds in steps)
    return deviations[int(0.9 * (len(deviations) - 1))]


def slow_rank_delay(report_times: list[float]) -> float:
    """The extra seconds per step for the planted slow rank, from an even run's report times."""
    steps = step_seconds(report_times)
    if len(steps) < 10:
        raise ValueError(f"{len(report_times)} reports: too few to measure the machine's noise")
    return min(CEILING_SECONDS, max(FLOOR_SECONDS, MARGIN * spread(steps)))
