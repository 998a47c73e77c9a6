"""The drill's records and helpers: a Trial (one fault's run and its figures), reading a run
directory (events, reports, status), ending a run and every process of its job, and comparing two
results."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Which faults a target offers is its backend's (Backend.drill_faults); `repeat` takes two hang limits,
# so it runs only when asked for by name.
ASKED_BY_NAME = ("repeat",)
REPEAT_RESTARTS = 3  # what the governor must not spend
POINTS = ("start", "step", "checkpoint")
POLL_SECONDS = 0.1
HANG_FLOOR_SECONDS = 5  # the drill's hang_timeout: at least this, or 10x the clean run's slowest step
# Each run of a trial ends within 2x the clean run plus its fault's allowance and this margin, or the
# drill ends it: a fault the job never notices is a FAIL, not a wait.
TRIAL_MARGIN_SECONDS = 60
END_GRACE_SECONDS = 15  # a trial's `jaxlaunch run` gets this long to end its job after SIGTERM

class TrialTimedOut(Exception):
    """A run of the drill did not end within its bound."""


def end_run(process: subprocess.Popen, run_dir: Path) -> None:
    """End a drill's `jaxlaunch run` and everything of its job: a rank it SIGSTOPped is continued
    first (a stopped process cannot act on SIGTERM), then SIGTERM (the supervisor cancels the job and
    collects stacks), then SIGKILL to whatever is left."""
    from ...supervisor.processes import job_processes, kill_job_processes

    for pid in job_processes(run_dir):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(END_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    kill_job_processes(run_dir)


@dataclass
class Trial:
    fault: str
    point: str
    rank: int
    target_step: int | None = None     # the step the fault hit (None: a job that never reports)
    target_seconds: float | None = None  # a job that never reports: seconds after its start
    injected_at: float | None = None
    detected: bool = False
    detect_seconds: float | None = None
    faulted_state: str | None = None   # how the attempt the fault hit ended
    final_state: str | None = None
    recover_seconds: float | None = None
    steps_lost: int | None = None
    steps_lost_from: str | None = None  # reports (ctx.report), output (`step N` printed: at least) or unknown
    same_result: bool | None = None
    passed: bool = False
    why: list = field(default_factory=list)
    run_dir: str = ""
    node: str | None = None            # a node fault: the node set DOWN
    timed_out: bool = False            # the drill ended the run: it did not end within its bound
    injected_step: int | None = None   # the last step the job had reported when the fault hit
    notes: list = field(default_factory=list)  # what was not judged, and why (no failure)
    attempts: int | None = None        # attempts the run made (attempt_ended events)
    governor: str | None = None        # why the governor stopped the job, when it did
    blamed: list | None = None         # the ranks jaxlaunch named as the cause, first first


def jaxlaunch_path() -> str:
    return shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"


def read_events(run_dir: Path) -> list[dict]:
    from ...rundir import RunDirectory

    return sorted(RunDirectory(run_dir).read_events(), key=lambda e: e.get("time", 0))


def read_reports(run_dir: Path) -> list[dict]:
    from ...rundir import RunDirectory
    from ...rundir.metrics import read_lines

    return sorted((r for r in read_lines(RunDirectory(run_dir).metrics_file) if r.get("kind") == "metrics"),
                  key=lambda r: r["time"])


def read_status(run_dir: Path) -> dict:
    from ...rundir import RunDirectory

    try:
        return json.loads(RunDirectory(run_dir).status_file.read_text())
    except (OSError, ValueError):
        return {}


def same_result(clean, other, tolerance: float, ignore=()) -> tuple[bool, str]:
    """(equal, where they differ first): numbers bit for bit (tolerance 0) or within `tolerance`
    (relative and absolute), arrays and nested lists and mappings alike. Keys named in `ignore`
    (a name anywhere, or a dotted path) are not compared."""
    import numpy as np

    def walk(a, b, path):
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return f"{path or 'the result'}: keys {sorted(a)} != {sorted(b)}"
            for key in a:
                if key in ignore or (f"{path}.{key}" if path else str(key)) in ignore:
                    continue
                found = walk(a[key], b[key], f"{path}.{key}" if path else str(key))
                if found:
                    return found
            return ""
        try:
            x, y = np.asarray(a), np.asarray(b)
        except Exception:  # noqa: BLE001  (not an array: compare as values)
            return "" if a == b else f"{path}: {a!r} != {b!r}"
        if x.dtype.kind in "fciu" and y.dtype.kind in "fciu":
            if x.shape != y.shape:
                return f"{path}: shape {x.shape} != {y.shape}"
            equal = np.array_equal(x, y) if tolerance == 0 else np.allclose(x, y, rtol=tolerance, atol=tolerance)
            if equal:
                return ""
            if x.ndim == 0:
                return f"{path}: {a!r} != {b!r}"
            return f"{path}: differs (largest difference {float(np.max(np.abs(x - y))):.3g})"
        return "" if a == b else f"{path}: {a!r} != {b!r}"

    where = walk(clean, other, "")
    return not where, where
