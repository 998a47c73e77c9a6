"""Steps computed again, read from what a program printed, for a program that reports no steps
(issue 51, finding 8: a script that restarted from step 0 after a kill scored STEPS LOST 0). Each
rank's log of each attempt (logs/attempt-K/rank-N.log, the last attempt's in logs/) is searched for
`step N`; a restart lost the steps from the first one printed after it to the last one printed
before it. Prints are sparse (every 20 steps, say), so this is a lower bound."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from ...rundir.names import RANK_LOG, every_rank

STEP = re.compile(rb"\bstep\s*[=:#]?\s*(\d+)", re.IGNORECASE)


@dataclass
class PrintedLoss:
    steps: int          # steps computed again, at least
    started_over: bool  # an attempt after the fault began where the first attempt began
    detail: str         # the lines it was read from, in words


def printed_steps(log: Path) -> list[int]:
    try:
        return [int(match) for match in STEP.findall(log.read_bytes())]
    except OSError:
        return []


def steps_by_attempt(run_dir: Path, attempts: list[int]) -> dict[int, dict[int, list[int]]]:
    """{attempt: {rank: the steps its log names, in order}}; the last attempt's logs are not archived."""
    logs = Path(run_dir) / "logs"
    found = {}
    for attempt in attempts:
        folder = logs / f"attempt-{attempt}"
        if attempt == attempts[-1] and not folder.is_dir():
            folder = logs
        found[attempt] = {int(path.stem.split("-")[1]): printed_steps(path)
                          for path in folder.glob(every_rank(RANK_LOG)) if path.stem.split("-")[1].isdigit()}
    return found


def printed_loss(run_dir: Path, attempts: list[int], faulted: int) -> PrintedLoss | None:
    """What the restarts after attempt `faulted` computed again, from the ranks' output; None when
    the output names no step on both sides of a restart."""
    printed = steps_by_attempt(run_dir, sorted(attempts))
    order = sorted(printed)
    total, started_over, details, seen = 0, False, [], False
    for before, after in zip(order, order[1:]):
        if before < faulted:
            continue
        worst = 0
        for rank, steps in printed[before].items():
            again = printed[after].get(rank) or []
            if not steps or not again:
                continue
            seen = True
            lost = max(0, max(steps) - again[0])
            first_ever = (printed[order[0]].get(rank) or [again[0]])[0]
            if lost and again[0] <= first_ever:
                started_over = True
            if lost >= worst:
                worst = lost
                detail = f"rank {rank} printed step {max(steps)} in attempt {before} and step {again[0]} first in attempt {after}"
        if worst:
            total += worst
            details.append(detail)
    if not seen:
        return None
    return PrintedLoss(total, started_over, "; ".join(details) or "no step printed twice")
