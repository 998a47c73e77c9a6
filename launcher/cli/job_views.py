"""The words for what the backends answer in records (launcher/backends/records.py): the status
table's headers and cells, the lines under it about one job (requeues, spare nodes), the line that
stands for a backend that could not be asked, the verdict under `explain`'s check and the state
that `submit --wait` echoes. Pure: records in, text out. A backend fills in records; the CLI's
prose is written here once, for every backend."""

from __future__ import annotations

import json
import os

from ..backends.records import NO_RESULT, SchedulerUnreachable
from ..errors import SchedulerError
from ..states import Cause, JobState

# A swap's cause, in status's line (`node3 -> node5 (node failure)`).
SWAP_WORDS = {Cause.NODE_FAILURE: "node failure", Cause.HEALTH_CHECK: "failed the health check",
              Cause.HANG: "held up a hang"}
RESULT_WIDTH = 60  # the RESULT cell's longest text; longer is cut, ending '...'
NO_RESULT_WORDS = "every rank exited 0; no result (a script or module)"


def count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def shown_path(path) -> str:
    """A path under the working directory as the user typed it (runs/...), others absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def state_text(state: JobState, reason: str = "") -> str:
    """'PENDING (Resources)': the state, with the scheduler's reason while the job waits."""
    return f"{state} ({reason})" if reason else str(state)


def wait_line(job_id: str, state: JobState, reason: str = "") -> str:
    """What `submit --wait` echoes at each change of state."""
    return f"job {job_id}: {state_text(state, reason)}"


def state_cell(backend, info) -> str:
    if not info.scheduler_knows:  # forgotten (MinJobAge): its last state is final, or unknown from here
        state = info.state
        return str(state) if state.final else f"unknown: {backend.scheduler_name} no longer knows it (last seen {state})"
    return state_text(info.state, info.reason)


def elapsed_cell(info) -> str:
    """'0:42/1:00:00': elapsed against the time limit, when there is one (one word: tables and
    scripts split rows on whitespace)."""
    return f"{info.elapsed}/{info.time_limit}" if info.time_limit else info.elapsed


def result_cell(info) -> str:
    """The result's scalars, or the root cause, shortened."""
    if info.result is not NO_RESULT:
        value = info.result
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if isinstance(v, (int, float, str, bool))}
        summary = json.dumps(value)
    else:
        summary = info.failure
        if not summary and info.state == JobState.COMPLETED:  # a script or module: no value, its exit code
            summary = NO_RESULT_WORDS
    return summary if len(summary) <= RESULT_WIDTH else summary[:RESULT_WIDTH - 3] + "..."


# The optional columns, by the JobInfo field a backend fills (Backend.info_fields).
COLUMNS = {
    "elapsed": ("ELAPSED/LIMIT", elapsed_cell),
    "nodes": ("NODES", lambda info: info.nodes),
    "seconds": ("DURATION", lambda info: "" if info.seconds is None else f"{info.seconds:.1f} s"),
    "result": ("RESULT", result_cell),
}


def has_ids(backend) -> bool:
    """A backend without ids of its own (a local run) names a job by its run directory."""
    return bool(backend.id_name)


def status_table(backend, infos) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of one backend's table: the job (its id, or its run directory), its state,
    the columns of the fields the backend fills, and the run directory of a job with an id."""
    optional = [COLUMNS[name] for name in backend.info_fields]
    first = "JOBID" if has_ids(backend) else f"{backend.name.upper()} RUN"
    headers = [first, "STATE", *(header for header, _ in optional), *(["RUN DIR"] if has_ids(backend) else [])]
    rows = []
    for info in infos:
        job = info.job_id if has_ids(backend) else shown_path(info.run_dir)
        rows.append([job, state_cell(backend, info), *(cell(info) for _, cell in optional),
                     *([str(info.run_dir or "")] if has_ids(backend) else [])])
    return headers, rows


def job_label(backend, info) -> str:
    """What begins `status`'s lines about one job: 'job 12', or a local run's directory."""
    return f"job {info.job_id}" if has_ids(backend) else shown_path(info.run_dir)


def swap_text(swap) -> str:
    """'node3 -> node5 (node failure)' for one spare swap."""
    cause = SWAP_WORDS.get(swap.cause, swap.cause)
    pairs = ", ".join(f"{old} -> {new}" for old, new in zip(swap.nodes, swap.spares))
    return f"{pairs} ({cause})" if pairs else f"{', '.join(swap.nodes)} ({cause})"


def note_lines(info) -> list[str]:
    """The lines under the table about how a job survived: 'requeued 2 times: 1 preemption, 1 time
    limit', '1 spare-node swap inside the allocation (no requeue): node2 -> node3 (node failure)'."""
    lines, requeues = [], info.requeues
    if requeues.total:
        line = (f"requeued {count(requeues.total, 'time')}: {count(requeues.preemptions, 'preemption')}, "
                f"{count(requeues.timeouts, 'time limit')}")
        if requeues.hangs:
            line += f", {count(requeues.hangs, 'hang')}"
        if requeues.bad_nodes or requeues.excluded_nodes:
            line += (f", {count(requeues.bad_nodes, 'bad-node requeue')}; excluded nodes: "
                     f"{', '.join(requeues.excluded_nodes) or 'none'}")
        lines.append(line)
    if info.spare_swaps:
        lines.append(f"{count(len(info.spare_swaps), 'spare-node swap')} inside the allocation (no requeue): "
                     + "; ".join(swap_text(swap) for swap in info.spare_swaps))
    return lines


def not_asked_line(backend, error: Exception, listed: int) -> str:
    """The one line `jaxlaunch status` prints in place of a backend's part that `error` stopped:
    why, and the fix when there is one. `listed`: how many jobs and sweeps the part would show."""
    if not (backend.scheduler_name and isinstance(error, SchedulerError)):
        said = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        return f"the {backend.name} backend's jobs could not be shown: {said}"
    said = [line.strip() for line in error.stderr.splitlines() if line.strip()]
    unreachable = isinstance(error, SchedulerUnreachable)
    why = (unreachable and error.why) or (said[-1] if said else f"{error.argv[0]} exited {error.returncode}")
    fix = error.fix if unreachable else ""
    jobs = f"{listed} job{'s' if listed > 1 else ''}"
    line = f"{backend.scheduler_name} could not be asked about the {jobs} jaxlaunch submitted: {why}"
    return line + (f"; fix: {fix}" if fix else "")


def fit_verdict(fit) -> str | None:
    """The last line of `explain`'s check: 'the request fits the cluster'; None after a refusal, or
    where the backend checked against nothing of its own."""
    if fit.problems or not fit.checked_against:
        return None
    return f"the request fits {fit.checked_against}" if not fit.warnings else "the request was not fully checked"


def fit_lines(fit) -> list[str]:
    """`explain`'s check: each refusal and warning, then the verdict."""
    verdict = fit_verdict(fit)
    return [*(f"refused: {p}" for p in fit.problems), *(f"warning: {w}" for w in fit.warnings),
            *([verdict] if verdict else [])]
