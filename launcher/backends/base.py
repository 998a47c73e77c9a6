"""The seam every backend implements: `Backend` plans, starts and finds jobs, `Job` is the handle.

A `Job` answers from its run directory (status.json, failure.json, logs) and from its backend
(the scheduler's view, the supervisor's process). `repr` does no I/O. `wait` backs off: it asks
again after 0.5 s, then 1.5 times longer each time the state stays the same, up to `MAX_POLL`.

Code outside a backend's package reaches it only through this seam: `get_backend(name)` and
`find_job(ref)` (launcher/backends/__init__.py) give a `Backend` or a `Job`, whose methods below
are all the CLI, the status tables, doctor, explain and the Python API use. What a new backend
must write: the abstract methods (`Job.state/logs/cancel`, `Backend.plan/start_plan/find`); every
other method has a default that suits a backend without that feature (no sweeps, no resume, no
scheduler of its own to ask).

  routing       Backend.claims(ref): is this text one of my job ids (no I/O)
  planning      Backend.plan(...) -> Plan; Plan.describe() is what render and --dry-run print, and
                Backend.start(...) is start_plan(plan(...)): what is shown is what starts
  status        Backend.listed/resolve/job_infos/sweep_states: this backend's part of `jaxlaunch
                status`, as records (records.py: JobInfo); one backend that cannot be asked spoils
                only its part
  explain       Backend.placement/check_fit (records.Fit)/container_command
  doctor        Backend.start_doctor_checks(env)

The seam answers with records and typed errors (records.py), never with the CLI's sentences:
launcher/cli/job_views.py renders them, so a new backend writes none of the CLI's prose.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

from ..errors import JobFailedError, NoResultError, UnknownJobError, UsageError
from ..rundir import RunDirectory
from ..states import JobState, StatusRecord
from .records import (  # the seam's records, re-exported: a backend imports them from here
    NO_RESULT, Fit, ForgottenJobError, JobInfo, NoLogYet, NoRunDirectory, Requeues, SchedulerUnreachable, SpareSwap,
    UnknownJobsError, history_fields)
from ..supervisor.allocation import Allocation  # the in-job side of the seam (backends implement it)

FIRST_POLL, MAX_POLL, BACKOFF = 0.5, 10.0, 1.5


class Job(ABC):
    """A handle on one job: `id`, `run_dir`, and the methods below (the same for every backend)."""

    backend = ""
    # What messages call this backend's scheduler ('Slurm'); empty for a backend whose jobs are
    # jaxlaunch's alone (a local run), which nothing outside jaxlaunch can forget.
    scheduler_name = ""

    def __init__(self, job_id: str, run: RunDirectory | None):
        self.id = job_id
        self.run = run
        self.warnings: list[str] = []  # what the checks before the start could not confirm (submit prints them)

    @property
    def run_dir(self) -> Path | None:
        return None if self.run is None else self.run.path

    def __repr__(self) -> str:  # no I/O: a notebook shows many of these
        return f"{type(self).__name__}(id={self.id!r}, run_dir={str(self.run_dir)!r})"

    def status(self) -> StatusRecord:
        """status.json as a record (state PENDING before anything wrote it)."""
        return self.run.status() if self.run is not None else StatusRecord()

    @abstractmethod
    def state(self) -> JobState:
        """The job's state now."""

    def progress(self):
        """How far the job has got (launcher.rundir.metrics.Progress: step, total, steps_per_second,
        eta_seconds, metrics, rank_step_seconds), from its ctx.report calls; None before the first."""
        from ..rundir.metrics import progress

        return None if self.run is None else progress(self.run.path)

    def goodput(self):
        """Where the wall time went (launcher.rundir.goodput.Goodput: seconds per category, steps_recomputed,
        goodput, rows()), from the run directory's records."""
        from ..rundir.goodput import goodput

        if self.run is None:
            raise NoRunDirectory(self.id, self.backend, self.records_index())
        return goodput(self.run.path)

    def records_index(self) -> Path | None:
        """Where jaxlaunch records the jobs it starts on this backend (Slurm: its index of submitted
        jobs), named in the errors about a job it cannot find; None for none. No I/O."""
        return None

    def metrics(self, as_frame: bool = False):
        """Every report of rank 0: [{'step', 'time', **metrics}], oldest first (over restarts); with
        `as_frame=True` a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        from ..rundir.metrics import metrics

        rows = [] if self.run is None else metrics(self.run.path)
        if as_frame:
            import pandas

            return pandas.DataFrame(rows)
        return rows

    def done(self) -> bool:
        return self.state().final

    def wait(self, timeout: float | None = None, on_change=None) -> JobState:
        """Block until the job ends; its final state. TimeoutError after `timeout` seconds.
        `on_change(job, state)` is called with the first state and each change."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay, last = FIRST_POLL, None
        while True:
            state = self.state()
            if state != last:
                if on_change is not None:
                    on_change(self, state)
                last, delay = state, FIRST_POLL
            if state.final:
                return state
            if state == JobState.UNKNOWN:
                raise ForgottenJobError(self.id, self.backend, self.scheduler_name, self.run_dir)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {self.id} still {state} after {timeout} s")
                time.sleep(min(delay, left))
            else:
                time.sleep(delay)
            delay = min(delay * BACKOFF, MAX_POLL)

    def exit_code(self) -> int:
        """The exit code `jaxlaunch run` / `submit --wait` give for the job's final state: the
        supervisor's own (128 + the signal that stopped it), else the state's."""
        state, status = self.state(), self.status()
        if status.state == state and isinstance(status.exit_code, int) and not isinstance(status.exit_code, bool):
            return status.exit_code
        return state.exit_code()

    def result(self, timeout: float | None = None):
        """What the entrypoint returned on rank 0, once the job has ended (waits for it). A job
        that did not complete raises JobFailedError with its state and root cause, even when
        rank 0 wrote its value before another rank failed."""
        from ..rundir.results import load_result

        state = self.wait(timeout)
        if state == JobState.COMPLETED and self.run is not None and not self.run.result_file.exists() \
                and self._runs_program():
            raise NoResultError(f"job {self.id} COMPLETED (every rank exited 0), but it has no result: its entrypoint "
                                f"is a script or module, which returns none. To give it one, call "
                                f"launcher.context().set_result(value) in the program")
        if state != JobState.COMPLETED or self.run is None or not self.run.result_file.exists():
            failure = self.failure()
            why = f": {failure['summary']}" if failure else ""
            raise JobFailedError(f"job {self.id} has no result (state {state}){why}", state.value, failure)
        return load_result(self.run)

    def _runs_program(self) -> bool:
        try:
            return self.run.read_spec().runs_program
        except (OSError, ValueError):
            return False

    def failure(self) -> dict | None:
        """failure.json: the root cause of a failed, timed-out or cancelled job (None if none)."""
        return self.run.read_failure() if self.run is not None else None

    def failure_lines(self) -> list[str]:
        """The root cause in a few lines (what `jaxlaunch status` and `--wait` print)."""
        failure = self.failure()
        if failure is None:
            return []
        from ..supervisor.root_cause import summary_lines

        return summary_lines(failure, self.run.path)

    def rank_log(self, rank: int) -> Path:
        """Rank `rank`'s log file; UsageError for a rank the job does not have."""
        if self.run is None:
            raise UnknownJobError(f"job {self.id}: no run directory known, so no rank logs")
        try:
            processes = self.run.read_spec().num_processes
        except (OSError, ValueError):
            processes = None  # no readable spec.json: only the lower bound can be checked
        if rank < 0 or (processes is not None and rank >= processes):
            if processes is None:
                has, valid = "ranks numbered from 0", "0 and up"
            else:
                valid = "0" if processes == 1 else f"0 to {processes - 1}"
                has = f"{processes} rank{'s' if processes > 1 else ''}: {valid}"
            raise UsageError(f"--rank {rank}: job {self.id} has {has}.\n  fix: pass --rank N with N in {valid}.")
        return self.run.rank_log(rank)

    @abstractmethod
    def logs(self, rank: int | None = None) -> str:
        """Rank `rank`'s full log, or (None) the job's combined output ("" before there is any)."""

    def follow_logs(self, rank: int | None, write, poll_seconds: float = 0.5) -> None:
        """Print the log as it grows until the job has ended and the file stops growing."""
        raise UsageError(f"job {self.id}: its {self.backend} backend cannot follow logs (-f)")

    @abstractmethod
    def cancel(self) -> None:
        """Stop the job (its supervisor records CANCELLED)."""

    def exists(self) -> bool:
        """Whether anything knows this job: its run directory, else its backend (False: a wrong id).
        A handle with a run directory answers without I/O; one without may ask its backend once
        (and raise the backend's SchedulerError when it cannot be asked)."""
        return self.run is not None

    def pending_reason(self) -> str:
        """Why the scheduler keeps the job waiting ('Resources'), from its last answer (no new I/O);
        '' when it is not waiting, or the scheduler did not say."""
        return ""

    def info(self) -> JobInfo:
        """The job as `jaxlaunch status` shows it: its state, why it waits, and from its status.json
        how often it requeued itself or swapped in a spare node."""
        state = self.state()
        return JobInfo(self.id, self.backend, state, self.run_dir,
                       reason=self.pending_reason() if state == JobState.PENDING else "",
                       **history_fields(self.status()))

    def log_path(self, rank: int | None = None) -> Path | None:
        """The one file `logs(rank)` reads, when there is one (`jaxlaunch logs` says so while it does
        not exist yet); None when `logs(rank)` can just be printed (it is "" before there is any
        output). UsageError for a rank the job does not have."""
        return None


class Plan(ABC):
    """What starting a spec (or a sweep) would do, decided before anything is created. `describe()`
    is what `jaxlaunch render` and `--dry-run` print, and `Backend.start_plan` starts this same
    object (torchx's `schedule(dryrun(...))`), so what is shown and what starts cannot disagree.
    Made by `Backend.plan`, which checks first what it can (a plan is of something that can start).
    A sweep's plan shows what `Backend.start_sweep` does, which builds it from the same functions.

    `subject` is the JobSpec or the Sweep; `run_dir` the run (or sweep) directory it shows, named
    as of now; `requested` what the caller asked for (a path, or None for the spec's run_dir or
    runs/{name}-{time}), which `start_plan` creates. Only when that yields another folder (the
    name was taken within the same second) does the job run in a folder other than the one shown,
    with the same plan made for it."""

    def __init__(self, subject, run_dir: Path, requested=None):
        self.subject = subject
        self.run_dir = Path(run_dir)
        self.requested = requested

    @abstractmethod
    def describe(self) -> str:
        """The text `render` and `--dry-run` print, ending in a newline. No I/O."""


class Placement:
    """Where a backend starts a spec's ranks, as `jaxlaunch explain` shows it (no I/O to make):
    `where` ('this machine, under mpirun'), `node_env` (what every rank of a node sees before its
    devices are chosen: Slurm's CUDA_VISIBLE_DEVICES of a GPU job) and `rank_env` (what the
    backend adds to every rank's environment after that)."""

    def __init__(self, where: str, node_env: dict[str, str] | None = None, rank_env: dict[str, str] | None = None):
        self.where, self.node_env, self.rank_env = where, dict(node_env or {}), dict(rank_env or {})


class Backend(ABC):
    """Plans, starts and finds jobs. Subclasses: local.LocalBackend, slurm.SlurmBackend.
    Making one does no I/O."""

    name = ""
    # How this backend's job ids look, for the CLI's messages: "a Slurm job id" and "a number,
    # e.g. 12345, or 123_4 for an array task"; empty when it has none (a local run is named by
    # its run directory).
    id_name = ""
    id_example = ""
    # The faults `jaxlaunch drill --target NAME` can inject into this backend's jobs (inject_fault);
    # none by default. backends/faults.py delivers kill, preempt and hang to ranks on this machine.
    drill_faults: tuple[str, ...] = ()
    # What messages call this backend's scheduler ('Slurm': "unknown: Slurm no longer knows it");
    # empty for a backend whose jobs are jaxlaunch's alone.
    scheduler_name = ""
    # The JobInfo fields this backend fills beyond id, state and run directory, so that `status`
    # shows their columns: Slurm's ("elapsed", "nodes"), local's ("seconds", "result").
    info_fields: tuple[str, ...] = ()

    # --- routing ---------------------------------------------------------------------------

    def claims(self, ref: str) -> bool:
        """Whether `ref` (a command-line argument) is one of this backend's job ids, from its text
        alone: no I/O. A run directory is no backend's claim: `find_job` reads its status.json."""
        return False

    @abstractmethod
    def find(self, ref, run: RunDirectory | None = None) -> Job:
        """A handle on an earlier job of this backend: `ref` is a job id it claims (with `run`, its
        run directory, when the caller has it) or, for a backend without ids, a run directory.
        UsageError when `ref` names no single job."""

    def find_to_cancel(self, ref: str) -> Job:
        """The handle `jaxlaunch cancel REF` cancels: as `find`, except that an id naming a group
        of jobs (a Slurm job array) gives one handle on the whole group."""
        return self.find(ref)

    # --- planning and starting -----------------------------------------------------------------

    @abstractmethod
    def plan(self, spec_or_sweep, run_dir=None, max_parallel: int | None = None) -> Plan:
        """The plan of starting a JobSpec (or a Sweep) in `run_dir` (None: the spec's run_dir, else
        runs/{name}-{time}); nothing is created or started. Raises what would stop it from
        starting that can be told without creating anything (SpecError, UsageError)."""

    def preview(self, spec_or_sweep, run_dir=None, max_parallel: int | None = None) -> str:
        """What starting it would do, as text (`render`, `--dry-run`): `plan(...).describe()`."""
        return self.plan(spec_or_sweep, run_dir, max_parallel).describe()

    @abstractmethod
    def start_plan(self, plan: Plan, files: dict[str, bytes] | None = None, **options) -> Job:
        """Start the job `plan` (of a JobSpec) describes, as it describes it, and return at once
        with its handle. `files` ({relative path: bytes}) are written into the run directory before
        the job starts (a function job's call); `options` are the backend's own (Slurm: `check`)."""

    def run_in_foreground(self, plan: Plan, echo=print, print_result=print) -> Job | None:
        """`jaxlaunch run`: the job `plan` describes run to its end in this process (local: the
        supervisor here); its handle. None where jobs run elsewhere: `run` then follows start_plan's job."""
        return None

    def start(self, spec, run_dir=None, files: dict[str, bytes] | None = None, **options) -> Job:
        """Start `spec` (a JobSpec) and return at once with its handle: `start_plan(plan(spec, run_dir))`."""
        return self.start_plan(self.plan(spec, run_dir), files, **options)

    def start_map(self, sweep, files: list[dict[str, bytes]], max_parallel: int | None = None) -> list[Job]:
        """Start every configuration of `sweep` (one per item of Executor.map), configuration i
        with `files[i]` in its run directory; returns at once with the handles, in order.
        The default: UsageError (a backend that runs no sweeps)."""
        raise UsageError(f"the {self.name} backend runs no sweeps")

    def start_sweep(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print, **options):
        """Start every configuration of `sweep` in a new sweep directory (`run_dir`), `max_parallel`
        at a time, echoing progress, and return at once: (the SweepDirectory, the job ids), which
        wait_for_sweep follows. `options` are the backend's own (Slurm: `check`, the cluster
        check before sbatch). The default: UsageError (a backend that runs no sweeps)."""
        raise UsageError(f"the {self.name} backend runs no sweeps")

    def run_sweep_in_foreground(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print):
        """`jaxlaunch run` of a sweep run here to its end: (the SweepDirectory, the exit code: 0 only
        if all completed). None where jobs run elsewhere: `run` then follows start_sweep's jobs."""
        return None

    def resume(self, run_dir, echo=print, print_result=print) -> Job:
        """`jaxlaunch run --resume RUN_DIR`: continue the run in RUN_DIR (preempted, failed or
        cancelled) in the same folder, with its spec; the handle once it has ended. UsageError
        where this backend cannot."""
        raise UsageError(f"the {self.name} backend cannot resume a run (--resume)")

    def wait_for_sweep(self, directory, echo, poll_seconds: float = 2.0) -> list:
        """Follow every task of the sweep in `directory` (a SweepDirectory) to its end, echoing the
        summary line whenever it changes; the final TaskStates (launcher/sweeps/tasks.py)."""
        from ..sweeps.tasks import all_finished, summary_line

        last = None
        while True:
            states = self.sweep_states(directory)
            line = summary_line(directory, states)
            if line != last:
                echo(line)
                last = line
            if all_finished(states):
                return states
            time.sleep(poll_seconds)

    def states(self, jobs: list[Job]) -> dict[str, JobState]:
        """The state of many jobs, asking the backend as few times as it can (one call for all)."""
        return {job.id: job.state() for job in jobs}

    # --- jaxlaunch status ----------------------------------------------------------------------

    def listed(self) -> tuple[list, list[Job]]:
        """What `jaxlaunch status` without arguments shows of this backend: (sweep directories,
        job handles), newest first, from what this machine recorded (no scheduler call)."""
        return [], []

    def unlisted(self) -> int:
        """How many older jobs this backend knows that `listed` leaves out (status says so)."""
        return 0

    def resolve(self, refs: list[str]) -> tuple[list, list[Job]]:
        """The ids the user named that this backend claims, as (sweep directories, job handles),
        in their order; no scheduler call (`job_infos` asks once for all)."""
        return [], [self.find(ref) for ref in refs]

    def job_infos(self, jobs: list[Job]) -> list[JobInfo]:
        """One JobInfo per handle, in their order, asking the backend as few times as it can for all
        of them. A job neither the backend nor jaxlaunch knows (a wrong id) has none: `jaxlaunch
        status` ends with `unknown_jobs` of those. The default: each job's `info()`."""
        return [job.info() for job in jobs]

    def sweep_states(self, directory) -> list:
        """Every task's TaskState (launcher/sweeps/tasks.py) of the sweep in `directory`, asking
        the backend as few times as it can. The default reads each task's status.json alone."""
        from ..sweeps.tasks import states_from_runs

        return states_from_runs(directory)

    def unknown_jobs(self, ids: list[str]) -> UnknownJobsError:
        """The error for ids this backend claims that neither it nor jaxlaunch knows (not raised here)."""
        return UnknownJobsError(ids, self.name)

    # --- jaxlaunch explain and doctor ---------------------------------------------------------

    def placement(self, spec) -> Placement:
        """Where and with what environment this backend starts `spec`'s ranks (no I/O)."""
        return Placement(f"the {self.name} backend")

    def check_fit(self, spec) -> Fit:
        """Whether `spec` can ever start here (records.Fit: problems, each ending with its fix;
        warnings: what could not be checked). May ask the scheduler (Slurm: its partitions and nodes)."""
        return Fit()

    def requeue_policy(self, spec):
        """How a requeued attempt of `spec` would start again here (a record `explain` renders:
        slurm.requeue_policy.RequeuePolicy), or None where jobs are not requeued. May ask the scheduler."""
        return None

    def container_command(self, spec, run_dir: Path, workdir: Path) -> str:
        """How one rank of `spec` enters its container image as this backend starts it, as one
        shell-quoted line for `explain`; UsageError when this backend cannot start that image."""
        import shlex

        from ..launchers.rank_start import rank_command

        return shlex.join(rank_command(spec, "python", Path(run_dir), Path(workdir)))

    def inject_fault(self, fault: str, job_id: str | None, run_dir: Path, rank: int,
                     processes_per_node: int) -> str | None:
        """`jaxlaunch drill`: inject `fault` (one of drill_faults) into a running job of this backend,
        as its scheduler would deliver it; the node set DOWN (for end_fault), else None. `job_id`:
        status.json's, None where the backend gives none. Raises an exception whose message says why
        it could not (backends/faults.py's FaultNotInjected)."""
        raise UsageError(f"jaxlaunch drill cannot inject faults through the {type(self).__name__}")

    def end_fault(self, node: str) -> None:
        """Undo what inject_fault left behind (a node set DOWN), once the trial is over."""

    def start_doctor_checks(self, env):
        """Start this backend's checks of this machine (`jaxlaunch doctor`) now, so that their
        commands run beside doctor's other probes, and return the function that collects them:
        it returns a list of launcher.checks.Check, in table order. `env`: the environment the
        commands run in. The default has no checks."""
        return lambda: []

