"""What the supervisor shows people: the rank output it passes through, the lines printed when a
job ends (`jaxlaunch run` and the batch job's log alike) and the result on stdout (a summary line,
when result.json is large)."""

from __future__ import annotations

import json
import sys

from ..rundir import RunDirectory
from ..spec import JobSpec
from ..states import JobState
from . import root_cause


def _write_to(stream, data: bytes) -> None:
    binary = getattr(stream, "buffer", None)
    if binary is not None:
        stream.flush()  # what was printed as text first stays first
        binary.write(data)
        binary.flush()
    else:
        stream.write(data.decode(errors="replace"))
        stream.flush()


def write_to_stderr(data: bytes) -> None:
    _write_to(sys.stderr, data)


def write_to_stdout(data: bytes) -> None:
    _write_to(sys.stdout, data)


def describe_outcome(spec: JobSpec, run: RunDirectory, outcome, seconds: float) -> list[str]:
    """What `jaxlaunch run` and the batch job print when the job ends."""
    if outcome.state == JobState.COMPLETED:
        count = outcome.attempts - 1 if outcome.restarts is None else outcome.restarts
        restarts = f" after {count} restart(s)" if count else ""
        done = f"jaxlaunch: job {spec.name} COMPLETED in {seconds:.1f} s{restarts}"
        if not run.result_file.exists():  # a script or module that set none (launcher.context().set_result)
            return [f"{done}; every rank exited 0 (the program set no result)"]
        return [f"{done}; result: {run.result_file}"]
    if outcome.state == JobState.PREEMPTED:
        return [f"jaxlaunch: job {spec.name} PREEMPTED after {seconds:.1f} s: it checkpointed and stopped on a notice",
                f"  continue it with: jaxlaunch run --resume {run.path}"]
    if outcome.state == JobState.REQUEUED:
        return [f"jaxlaunch: job {spec.name} REQUEUED after {seconds:.1f} s; it resumes from its latest checkpoint"]
    lines = root_cause.summary_lines(outcome.failure, run.path)
    lines[0] = f"jaxlaunch: job {spec.name} {lines[0]}"
    lines.append(f"  logs: {run.logs}")
    return lines


# stdout gets the whole result up to this many characters of JSON; a larger one (a list of losses,
# a long log) gets a summary line: the run's last line stays readable, and result.json has it all.
SHORT_RESULT = 2000
SHORT_VALUE = 80  # a summary keeps the top-level values up to this long, and names the others


def result_text(run: RunDirectory, limit: int = SHORT_RESULT) -> str | None:
    """result.json as one line of JSON, for stdout: all of it when that is at most `limit`
    characters, else `summarize_result`'s line; None when there is no result.json."""
    try:
        text = run.result_file.read_text()
    except FileNotFoundError:
        return None
    value = json.loads(text)
    whole = json.dumps(value)
    return whole if len(whole) <= limit else json.dumps(summarize_result(value, limit))


def _described(value) -> str:
    """'<list of 500 items: see result.json>' for a value too long to show."""
    if isinstance(value, list):
        what = f"list of {len(value)} items"
    elif isinstance(value, dict) and "__ndarray__" in value:  # launcher/rundir/results.py's array marker
        what = f"array {value.get('dtype', '')}{list(value.get('shape', []))}"
    elif isinstance(value, dict):
        what = f"{len(value)} keys"
    elif isinstance(value, str):
        what = f"text of {len(value)} characters"
    else:
        what = type(value).__name__
    return f"<{what}: see result.json>"


def summarize_result(value, limit: int = SHORT_RESULT):
    """A short stand-in for a large result: a dict keeps its short values (numbers, flags, small
    configs) and names the long ones (`_described`), up to about `limit` characters of JSON, then
    counts the keys left out; any other value is named."""
    if not isinstance(value, dict):
        return _described(value)
    shown = {key: item if len(json.dumps(item)) <= SHORT_VALUE else _described(item) for key, item in value.items()}
    if len(json.dumps(shown)) <= limit:
        return shown
    kept: dict = {}
    for key, item in shown.items():
        if len(json.dumps({**kept, key: item})) > limit - 50:
            break
        kept[key] = item
    kept["..."] = f"<{len(shown) - len(kept)} more keys: see result.json>"
    return kept
