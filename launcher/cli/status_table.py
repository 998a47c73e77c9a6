"""What `jaxlaunch status` prints, from every backend's part: each lists its jobs and sweeps, answers
with a record per job (Backend.job_infos) and says its sweeps' task states; this module puts the
parts together, one blank line apart, each a table (job_views.py words the records) with the lines
under it and the sweeps' summaries. Without arguments, a backend that cannot be asked spoils only
its own part: one line says why (job_views.not_asked_line), the others stand, and the exit code is 0."""

from __future__ import annotations

from tabulate import tabulate

from ..backends import RUN_DEFAULT, all_backends, claimant, find_job, get_backend, registry
from ..errors import JaxlaunchError
from ..states import JobState
from .job_views import job_label, not_asked_line, note_lines, status_table

EXPLAINED_STATES = (JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)
NOTHING_YET = "no jobs submitted with jaxlaunch yet, and no local runs in runs/"


def progress_lines(job, name: str, verbose: bool, echo) -> None:
    """'job 12 step 420/1000 (42%), 12.3 steps/s, ETA 47 s; loss=0.123' (and, verbose, each rank's
    step time) for a job that reports progress (ctx.report); for one that has ended, the steps it
    did ('job 12 1000/1000 steps (100%), ...')."""
    if not job.state().final:
        still = still_line(job)
        if still:
            echo(f"{name} {still}")
    progress = job.progress()
    if progress is None:
        return
    echo(f"{name} {progress.line(ended=job.state().final)}")
    if progress.slow_line():
        echo(f"{name} {progress.slow_line()}")
    if verbose:
        for line in progress.rank_lines():
            echo(line)


STILL_SHOWN_SECONDS = 30  # a rank that has stood still this long is shown in `status`


def still_line(job) -> str | None:
    """'last progress: rank 0 2 s ago, rank 1 3 min 05 s ago' when a rank of a running job has not
    moved (its stack, or a report) for STILL_SHOWN_SECONDS: the hang watchdog's view."""
    import time
    from ..rundir.metrics import format_seconds

    run = getattr(job, "run", None)
    try:
        status = run.status() if run is not None else None
    except (OSError, ValueError):
        return None
    if status is None or not status.still or status.still_at is None:
        return None
    age = max(0.0, time.time() - status.still_at)
    seconds = {int(rank): value + age for rank, value in status.still.items()}
    if max(seconds.values()) < STILL_SHOWN_SECONDS:
        return None
    return "last progress: " + ", ".join(f"rank {rank} {format_seconds(s)} ago" for rank, s in sorted(seconds.items()))


def job_lines(backend, job, info, named: bool, verbose: bool, echo) -> None:
    """The lines under the table about one job (`info`: its record): how it survived (requeues,
    spare nodes), its progress (always for a job named on the command line, else while it runs)
    and, for a named job that failed, timed out or was cancelled, its root cause."""
    label = job_label(backend, info)
    for note in note_lines(info):
        echo(f"{label} {note}")
    if named or not job.state().final:
        progress_lines(job, label, verbose, echo)
    if verbose:
        for line in budget_lines(job):
            echo(f"{label} {line}")
    if named and job.state() in EXPLAINED_STATES:
        for line in job.failure_lines():
            echo(f"{label} {line}")


def budget_lines(job) -> list[str]:
    """`status -v`: each attempt's start-up budget, one line each (launcher/rundir/goodput.py)."""
    from ..rundir.goodput import BUDGET_PHASES

    if getattr(job, "run", None) is None or not job.run.status_file.exists():
        return []
    try:
        budgets = job.goodput().budgets
    except (OSError, ValueError, KeyError):
        return []
    lines = []
    for budget in budgets:
        if budget["total"] is None:
            continue
        parts = ", ".join(f"{name} {budget[name]:.1f}" for name in BUDGET_PHASES if budget[name])
        lines.append(f"attempt {budget['attempt']}: {budget['total']:.1f} s to its first report ({parts})")
    return lines


class _Parts:
    """Echoes the parts of `status` with one blank line between two parts that print something."""

    def __init__(self, echo):
        self._echo, self.printed, self._new_part = echo, False, False

    def new_part(self) -> None:
        self._new_part = True

    def separate(self) -> None:
        """The blank line owed before the first line of this part (or before its error)."""
        if self._new_part and self.printed:
            self._echo("")
        self._new_part = False

    def echo(self, line: str) -> None:
        self.separate()
        self.printed = True
        self._echo(line)


def _print_part(backend, sweeps: list, jobs: list, named: bool, verbose: bool, echo) -> None:
    """One backend's part: its sweeps' summaries (verbose: one row per task), its table, the
    lines under it; then, for ids named but unknown, the error (exit 2)."""
    from ..sweeps.tasks import summary_line

    for path in dict.fromkeys(directory.path for directory in sweeps):
        directory = next(d for d in sweeps if d.path == path)
        states = backend.sweep_states(directory)
        echo(summary_line(directory, states))
        if verbose:
            keys = directory.read()["keys"]
            echo(tabulate([[t.folder, t.job_id, t.state, t.elapsed, *(t.values.get(k) for k in keys)]
                           for t in states], headers=["TASK", "JOBID", "STATE", "ELAPSED", *keys]))
    if not jobs:
        return
    infos = backend.job_infos(jobs)
    known = [(job, info) for job, info in zip(jobs, infos) if not info.unknown]
    headers, rows = status_table(backend, [info for _, info in known])
    if rows:
        echo(tabulate(rows, headers=headers))
    for job, info in known:
        job_lines(backend, job, info, named, verbose, echo)
    unknown = [info.job_id for info in infos if info.unknown]
    if unknown:
        raise backend.unknown_jobs(unknown)


def _backend_of_sweep(directory) -> str:
    """The backend that ran the sweep in `directory` (sweep.json says; local if it does not)."""
    name = directory.read().get("backend") or RUN_DEFAULT
    return name if name in registry() else RUN_DEFAULT


def print_status(refs: list[str], verbose: bool, echo) -> None:
    """`jaxlaunch status [REFS]`: the jobs and sweeps named (job ids, sweep directories, run
    directories), else what each backend lists (the jobs jaxlaunch submitted, the recent local
    runs); a count of task states per sweep; the root cause of the named jobs that failed. Each
    backend's part is printed as soon as it is ready, in the registry's order."""
    parts = _Parts(echo)
    if not refs:
        for backend in all_backends():
            parts.new_part()
            sweeps, jobs = [], []
            try:
                sweeps, jobs = backend.listed()
                _print_part(backend, sweeps, jobs, False, verbose, parts.echo)
            except JaxlaunchError as error:  # this backend's part only: the others stand
                parts.echo(not_asked_line(backend, error, len(sweeps) + len(jobs)))
            hidden = backend.unlisted()
            if hidden:
                parts.echo(f"({hidden} older {backend.name} job{'s' if hidden > 1 else ''} not shown: "
                           f"`jaxlaunch status ID_OR_RUN_DIR` shows any of them)")
        if not parts.printed:
            echo(NOTHING_YET)
        return
    from ..sweeps.directory import SweepDirectory

    named = {name: ([], [], []) for name in registry()}  # sweep directories, ids, handles of run directories
    for ref in refs:
        backend = claimant(ref)
        if backend is not None:  # an id first, as a folder of that name could also be
            named[backend.name][1].append(ref)
        elif SweepDirectory.holds_a_sweep(ref):
            directory = SweepDirectory(ref)
            named[_backend_of_sweep(directory)][0].append(directory)
        else:  # a run directory: the job that ran there, of whichever backend
            job = find_job(ref)
            named[job.backend][2].append(job)
    for name, (sweeps, ids, handles) in named.items():
        if not (sweeps or ids or handles):
            continue
        backend = get_backend(name)
        parts.new_part()
        try:
            more_sweeps, jobs = backend.resolve(ids)
            _print_part(backend, [*sweeps, *more_sweeps], [*jobs, *handles], True, verbose, parts.echo)
        except JaxlaunchError:
            parts.separate()
            raise


__all__ = ["print_status", "progress_lines", "job_lines", "EXPLAINED_STATES"]
