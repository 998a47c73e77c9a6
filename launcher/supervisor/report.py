"""What the supervisor shows people: the rank output it passes through, the lines printed when a
job ends (`jaxlaunch run` and the batch job's log alike) and the result on stdout."""

from __future__ import annotations

import json
import sys

from ..rundir import RunDirectory
from ..spec import JobSpec
from ..states import JobState
from . import root_cause


def write_to_stderr(data: bytes) -> None:
    stream = getattr(sys.stderr, "buffer", None)
    if stream is not None:
        stream.write(data)
        stream.flush()
    else:
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()


def describe_outcome(spec: JobSpec, run: RunDirectory, outcome, seconds: float) -> list[str]:
    """What `jaxlaunch run` and the batch job print when the job ends."""
    if outcome.state == JobState.COMPLETED:
        count = outcome.attempts - 1 if outcome.restarts is None else outcome.restarts
        restarts = f" after {count} restart(s)" if count else ""
        return [f"jaxlaunch: job {spec.name} COMPLETED in {seconds:.1f} s{restarts}; result: {run.result_file}"]
    if outcome.state == JobState.PREEMPTED:
        return [f"jaxlaunch: job {spec.name} PREEMPTED after {seconds:.1f} s: it checkpointed and stopped on a notice",
                f"  continue it with: jaxlaunch run --resume {run.path}"]
    if outcome.state == JobState.REQUEUED:
        return [f"jaxlaunch: job {spec.name} REQUEUED after {seconds:.1f} s; it resumes from its latest checkpoint"]
    lines = root_cause.summary_lines(outcome.failure, run.path)
    lines[0] = f"jaxlaunch: job {spec.name} {lines[0]}"
    lines.append(f"  logs: {run.logs}")
    return lines


def result_text(run: RunDirectory, limit: int = 100_000) -> str | None:
    """result.json as one line of JSON, for stdout; None when there is none or it is too large."""
    try:
        text = run.result_file.read_text()
    except FileNotFoundError:
        return None
    return json.dumps(json.loads(text)) if len(text) <= limit else None
