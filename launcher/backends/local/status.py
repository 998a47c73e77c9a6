"""The local backend's table in `jaxlaunch status`: one row per run (LOCAL RUN, STATE, DURATION,
RESULT), read from its run directory alone."""

from __future__ import annotations

import json
import os
import time
from ...states import JobState

HEADERS = ["LOCAL RUN", "STATE", "DURATION", "RESULT"]


def shown_path(path) -> str:
    """A path under the working directory as the user typed it (runs/...), others absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def local_run_row(job) -> list[str]:
    """LOCAL RUN, STATE, DURATION, RESULT (the result's scalars, or the failure, shortened)."""
    status = job.status()
    seconds = (status.ended or time.time()) - status.started if status.started else None
    summary = ""
    try:
        value = json.loads(job.run.result_file.read_text())
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if isinstance(v, (int, float, str, bool))}
        summary = json.dumps(value)
    except (OSError, ValueError):
        failure = job.failure()
        summary = failure["summary"] if failure else ""
        if not summary and status.state == JobState.COMPLETED:  # a script or module: no value, its exit code
            summary = "every rank exited 0; no result (a script or module)"
    return [shown_path(job.run_dir), str(job.state()), "" if seconds is None else f"{seconds:.1f} s",
            summary if len(summary) <= 60 else summary[:57] + "..."]
