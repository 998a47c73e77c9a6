"""Whether jaxlaunch itself detected a fault and named the faulted rank (issue 51, finding 7): a hang
that JAX's coordination service ended by aborting a healthy rank, or a stop line that blames the healthy
rank, is no pass. Read from the faulted attempt's failure.json."""

from __future__ import annotations

import json
from pathlib import Path

from ...states import Cause
from .runs import Trial

# The failure.json reasons that are jaxlaunch's own detection of each fault: a rank that died is a
# failure the supervisor saw; a stopped rank is the hang watchdog's. Anything else (JAX's coordination
# service aborting a healthy rank, the spec's timeout, the drill's own bound) detected nothing.
DETECTED_AS = {"kill": (Cause.FAILED, Cause.LEFT_EARLY), "hang": (Cause.HANG, Cause.COLLECTIVE_TIMEOUT),
               "repeat": (Cause.HANG, Cause.COLLECTIVE_TIMEOUT)}


def attempt_failure(run_dir: Path, attempt) -> dict | None:
    """failure.json of one attempt: archived in logs/attempt-K/ once the job went on, else the run's own."""
    from ...rundir import RunDirectory

    run = RunDirectory(run_dir)
    for path in (run.logs / f"attempt-{attempt}" / run.failure_file.name, run.failure_file):
        try:
            failure = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if failure.get("attempt") == attempt:
            return failure
    return None


def blamed_ranks(failure: dict) -> list[int]:
    """The ranks jaxlaunch named as the cause, first first: the first failing rank; or the hang's
    culprits (the roll-call's; else the ranks that did not answer it while others did, a stopped
    process; else the ranks that never arrived at the collective the watchdog fired on)."""
    if failure.get("reason") in (Cause.FAILED, Cause.LEFT_EARLY):
        first = failure.get("first_failure") or {}
        return [first["rank"]] if isinstance(first.get("rank"), int) else []
    hang = failure.get("hang") or {}
    culprits = [c["rank"] for c in (hang.get("roll_call") or {}).get("culprits") or [] if "rank" in c]
    if culprits:
        return culprits
    ranks = hang.get("ranks") or []
    silent = [r["rank"] for r in ranks if not r.get("answered") and not r.get("left_main")]
    if silent and len(silent) < len(ranks):
        return silent
    return list(hang.get("never_arrived") or [])


def judge_blame(trial: Trial, run_dir: Path, ended: dict) -> None:
    """A detected fault counts only when jaxlaunch itself ended the attempt for it and named the
    faulted rank (issue 51, finding 7); otherwise the trial is not detected, or says whom it blamed."""
    wanted = DETECTED_AS.get(trial.fault)
    if wanted is None:  # a preemption has no rank; a node fault is judged by where the job went on
        return
    failure = attempt_failure(run_dir, ended.get("attempt"))
    if failure is None or failure.get("reason") not in wanted:
        trial.detected, trial.detect_seconds = False, None
        said = "no failure.json" if failure is None else f"{failure.get('reason')}: {failure.get('summary')}"
        trial.why.append(f"the {trial.fault} was not detected by jaxlaunch: the attempt it hit ended "
                         f"{trial.faulted_state} ({said})")
        return
    trial.blamed = blamed_ranks(failure)
    culprits = ((failure.get("hang") or {}).get("roll_call") or {}).get("culprits")
    # the roll-call's culprits come in its order of blame; any other list is by number: only one counts
    if trial.blamed[:1] != [trial.rank] or (len(trial.blamed) > 1 and not culprits):
        named = f"rank(s) {', '.join(map(str, trial.blamed))}" if trial.blamed else "no rank"
        trial.why.append(f"jaxlaunch named {named}, not the faulted rank {trial.rank}"
                         f"{' alone' if trial.rank in trial.blamed else ''}: {failure.get('summary')}")
