"""The Slurm tier's straggler test sizes its slow rank's delay from an even run's step times
(tests/straggler_delay.py): the 50 ms of a quiet machine, more where the machine is noisy."""

import random
import statistics

import pytest

from launcher.stragglers import TYPICAL_SHARE
from straggler_delay import CEILING_SECONDS, FLOOR_SECONDS, MARGIN, slow_rank_delay, spread, step_seconds


def times(steps):
    out, now = [], 100.0
    for seconds in [5.0, 5.0, *steps]:  # two warm-up steps that compile
        now += seconds
        out.append(now)
    return out


def test_a_quiet_machine_keeps_the_floor():
    assert slow_rank_delay(times([0.1] * 60)) == FLOOR_SECONDS
    assert slow_rank_delay(times([0.1 + 0.001 * (i % 3) for i in range(60)])) == FLOOR_SECONDS


def test_a_noisy_machine_gets_a_delay_that_its_noise_does_not_reach():
    rng = random.Random(7)
    noisy = [0.1 + rng.uniform(0, 0.06) for _ in range(60)]  # a loaded machine: steps stray by up to 60 ms
    delay = slow_rank_delay(times(noisy))
    assert delay == pytest.approx(MARGIN * spread(noisy), rel=1e-3) and delay > FLOOR_SECONDS
    # the detector's threshold (half the slow rank's typical wait) stays above the others' hiccups
    median = statistics.median(noisy)
    assert sum(abs(seconds - median) < TYPICAL_SHARE * delay for seconds in noisy) >= 0.9 * len(noisy)


def test_the_warm_up_steps_do_not_count_and_the_ceiling_holds():
    assert step_seconds(times([0.1] * 3)) == pytest.approx([0.1, 0.1])  # the 5 s compiles left out
    wild = [0.1, 3.0] * 30
    assert slow_rank_delay(times(wild)) == CEILING_SECONDS
    with pytest.raises(ValueError, match="too few"):
        slow_rank_delay(times([0.1] * 5))
