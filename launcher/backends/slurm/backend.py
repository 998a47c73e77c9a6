"""The Slurm backend: sbatch a rendered batch script; the job's supervisor runs inside it.

Handles ask Slurm through one `SlurmWatcher` per process, which refreshes every job it follows
with one batched query (squeue, then scontrol and sacct for the rest: at most three commands
however many jobs), less and less often while nothing changes, as submitit's InfoWatcher does. A
job whose supervisor has written its final state in status.json needs no scheduler call at all.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ...errors import SchedulerError, UnknownJobError, UsageError
from ...rundir import RunDirectory
from . import index, scheduler, spares
from .index import sweep_dir_of
from .submission import submit_job
from ...spec import JobSpec
from ...states import CANCEL_EVENT, JobState
from ..base import Backend, Job
from ..faults import HERE as FAULTS_HERE

MIN_REFRESH, MAX_REFRESH, BACKOFF = 1.0, 10.0, 1.5
# A running job whose supervisor keeps status.json fresh: Slurm is asked this seldom (issue 45's
# citizenship: 30 s per waiting client); the supervisor writes it at least every STILL_WRITE_SECONDS.
RUNNING_REFRESH, SUPERVISOR_SILENT = 30.0, 60.0
# How long `cancel` lets a running job's supervisor collect stacks and end its ranks (it takes
# supervise.ANSWER_SECONDS + TERMINATE_SECONDS at most) before Slurm ends the job.
CANCEL_GRACE_SECONDS = 15.0
# The states the supervisor inside the batch job writes when the job ends; it knows better than
# Slurm why (TIMEOUT from the spec's own timeout, not Slurm's FAILED for exit code 124).
SUPERVISOR_FINAL_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED)


class SlurmWatcher:
    """The scheduler's view of every job this process follows, refreshed in batches: one query
    for every unfinished job, at most every `interval` seconds. The interval starts at
    MIN_REFRESH and grows 1.5x after each refresh that changed nothing, up to MAX_REFRESH; a
    change brings it back down. A finished job is never asked about again."""

    def __init__(self):
        self._lock = threading.Lock()
        self._followed: set[str] = set()
        self._infos: dict[str, scheduler.JobInfo | None] = {}
        self._last_refresh = float("-inf")
        self.interval = MIN_REFRESH

    def follow(self, job_id: str) -> None:
        """Include `job_id` in the next refresh (no I/O: handles call it when they are made)."""
        with self._lock:
            self._followed.add(job_id)

    def refresh(self, job_ids=()) -> None:
        """Ask Slurm now about `job_ids` and every unfinished job followed, in one batch."""
        with self._lock:
            self._followed.update(job_ids)
            self._refresh()

    def _refresh(self) -> None:
        wanted = sorted(j for j in self._followed if not (self._infos.get(j) and self._infos[j].finished))
        answers = scheduler.query_jobs(wanted) if wanted else {}
        changed = False
        for job_id in wanted:
            old, new = self._infos.get(job_id), answers.get(job_id)
            changed |= job_id not in self._infos or (old and old.slurm_state) != (new and new.slurm_state)
            self._infos[job_id] = new
            if new is None:
                self._followed.discard(job_id)  # unknown to Slurm: asked again only when asked for
        self.interval = MIN_REFRESH if changed else min(self.interval * BACKOFF, MAX_REFRESH)
        self._last_refresh = time.monotonic()

    def info(self, job_id: str, max_age: float | None = None) -> scheduler.JobInfo | None:
        """Slurm's view of `job_id`: asked now if it was never asked, if the refresh interval (or
        `max_age`) has passed, else what the last refresh said. None when Slurm does not know it."""
        with self._lock:
            self._followed.add(job_id)
            info = self._infos.get(job_id)
            age = time.monotonic() - self._last_refresh
            if job_id not in self._infos or info is None and max_age is not None:
                self._refresh()
            elif not (info is not None and info.finished) and age >= (self.interval if max_age is None else max_age):
                self._refresh()
            return self._infos.get(job_id)

    def last_known(self, job_id: str) -> scheduler.JobInfo | None:
        """What the last refresh said of `job_id` (None if never asked, or unknown); no I/O."""
        with self._lock:
            return self._infos.get(job_id)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._infos.pop(job_id, None)
            self._followed.discard(job_id)


WATCHER = SlurmWatcher()


class SlurmJob(Job):
    backend = "slurm"

    def no_run_dir_message(self) -> str:
        """A Slurm job that jaxlaunch did not submit from this account has no run directory here."""
        return (f"job {self.id} has no run directory that jaxlaunch knows: it was not submitted by jaxlaunch "
                f"from this account (index: {index.jobs_index()}).\n  fix: name its run directory (RUN_DIR) instead "
                f"of the id, if it has one.")

    def __init__(self, job_id: str, run: RunDirectory | None, watcher: SlurmWatcher | None = None):
        super().__init__(job_id, run)
        self.watcher = watcher or WATCHER
        self.watcher.follow(job_id)

    def info(self, max_age: float | None = None) -> scheduler.JobInfo | None:
        """Slurm's view (state, elapsed, nodes, pending reason); None once Slurm forgot the job."""
        return self.watcher.info(self.id, max_age)

    def state(self) -> JobState:
        status = self.status()
        if status.state in SUPERVISOR_FINAL_STATES:
            return status.state
        # While the job's own supervisor says RUNNING and keeps writing status.json (every few s), the
        # run directory knows the state: Slurm is asked only every RUNNING_REFRESH, for a death the
        # supervisor cannot report (a node lost, the job's time limit). A 27 s job made 7 squeue calls.
        info = self.info(max_age=RUNNING_REFRESH if self._supervisor_reports(status) else None)
        if info is None:  # Slurm forgot it (or never knew the id)
            return status.state if status.state.final else JobState.UNKNOWN
        state = JobState.parse(info.state)
        if info.finished and self.run is not None and status.state != state:
            # Slurm ended it without the supervisor's word (cancelled while pending, its time limit,
            # a node failure): record that for `status` and later handles.
            self.run.update_status(state=state, slurm_state=info.slurm_state, exit_code=info.exit_code or None,
                                   ended=time.time())
        return state

    def _supervisor_reports(self, status) -> bool:
        """The batch job's supervisor says RUNNING and wrote status.json within SUPERVISOR_SILENT."""
        if status.state != JobState.RUNNING or self.run is None:
            return False
        try:
            return time.time() - self.run.status_file.stat().st_mtime < SUPERVISOR_SILENT
        except OSError:
            return False

    def exists(self) -> bool:
        """Known to the index (a run directory), else to Slurm (one batched query)."""
        return self.run is not None or self.info() is not None

    def describe_state(self, state: JobState) -> str:
        """With squeue's reason while the job waits ('PENDING (Resources)'), when Slurm's last
        answer is that state."""
        info = self.watcher.last_known(self.id)
        return info.describe_state() if info is not None and JobState.parse(info.state) == state else str(state)

    def no_log_yet(self, rank: int | None = None) -> str | None:
        path = self.log_path(rank)
        if path.exists():
            return None
        return f"no log yet at {path}" + ("" if rank is None else f" (does rank {rank} exist?)")

    def unknown_message(self) -> str:
        where = f" (run directory: {self.run_dir})" if self.run is not None else ""
        return (f"job {self.id} is not known to Slurm{where}: it ended and was purged before it was seen to "
                f"finish, or the id is wrong.\n  fix: see `jaxlaunch logs {self.id}` and the run directory's "
                f"status.json.")

    def logs(self, rank: int | None = None) -> str:
        path = self.log_path(rank)
        return path.read_text(errors="replace") if path.exists() else ""

    def log_path(self, rank: int | None = None) -> Path:
        if self.run is None:
            raise UsageError(f"no run directory known for job {self.id}: it was not submitted by jaxlaunch "
                             f"from this account (index: {index.jobs_index()})")
        if rank is not None:
            return self.rank_log(rank)
        # an array task's output is the array's (SWEEP_DIR/logs/slurm-%A_%a.out), recorded at submission
        return Path(self.status().log or self.run.path / f"slurm-{self.id}.out")

    def follow_logs(self, rank: int | None, write, poll_seconds: float = 0.5) -> None:
        """Print the log as it grows, until the job has ended and the file stops growing."""
        path = self.log_path(rank)
        offset = 0
        while True:
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                if chunk:
                    write(chunk.decode(errors="replace"))
                    offset += len(chunk)
            if self.done() and (not path.exists() or path.stat().st_size == offset):
                return
            time.sleep(poll_seconds)

    def cancel(self) -> None:
        """End the job as CANCELLED, never requeued. A running job's supervisor is asked first
        (SIGTERM to the batch shell alone): it collects every rank's stacks into failure.json and
        ends the ranks, as a local cancel does. Slurm's own cancel signals every process of the job
        at once, and mpirun then kills its ranks before they can answer. Then scancel, which
        releases the nodes (and ends a pending job). An id Slurm does not know is an error
        (scancel itself exits 0 for it)."""
        info = self.info(max_age=0)
        if info is None:
            raise UnknownJobError(f"job {self.id} is not known to Slurm: nothing to cancel.\n"
                                  f"  fix: check the id with `squeue --me` or `jaxlaunch status`.")
        runs = self._runs()
        for run in runs:
            # Before any signal: the supervisor reads it to tell this SIGTERM from a preemption's.
            run.log_event(CANCEL_EVENT, by="jaxlaunch cancel")
        supervised = [run for run in runs if run.status().state == JobState.RUNNING]
        if supervised and info.state == JobState.RUNNING:
            try:
                scheduler.call_slurm(["scancel", "--batch", "--signal=TERM", self.id])
            except SchedulerError:
                pass  # it is ending already; the scancel below still ends it
            deadline = time.monotonic() + CANCEL_GRACE_SECONDS
            while time.monotonic() < deadline and not all(run.status().state.final for run in supervised):
                time.sleep(0.2)
        try:
            scheduler.cancel(self.id)
        except SchedulerError:
            # Its supervisor ended it meanwhile (it scancels its own job after a cancel): fine.
            now = self.info(max_age=0)
            if now is not None and not now.finished:
                raise
        self.watcher.forget(self.id)
        for run in runs:
            if run.status().state == JobState.SUBMITTED:
                # It never started, so no supervisor will record its end (and Slurm soon forgets
                # a cancelled pending array task).
                run.update_status(state=JobState.CANCELLED, ended=time.time(), reason="cancelled before it started")

    def _runs(self) -> list[RunDirectory]:
        """This job's run directory, or every task's for an array id."""
        if self.run is not None:
            return [self.run]
        sweep = sweep_dir_of(self.id)
        if sweep is None:
            return []
        return [run for task, run in sweep.task_runs() if task.get("job_id", "").startswith(f"{self.id}_")]

    def status_notes(self) -> list[str]:
        return [line for line in (self.requeue_line(), self.spare_line()) if line]

    def spare_line(self) -> str | None:
        """'spare nodes in use: node2 -> node3 (node failure)' once a spare took a node's place."""
        swaps = self.status().spare_swaps or []
        if not swaps:
            return None
        return (f"{_count(len(swaps), 'spare-node swap')} inside the allocation (no requeue): "
                + "; ".join(spares.describe_swap(swap) for swap in swaps))

    def requeue_line(self) -> str | None:
        """'requeued 2 times: 1 preemption, 1 time limit' for a job that requeued itself, else None."""
        status = self.status()
        if not status.requeues:
            return None
        line = (f"requeued {_count(status.requeues, 'time')}: {_count(status.preemptions, 'preemption')}, "
                f"{_count(status.timeouts, 'time limit')}")
        if status.hang_requeues:
            line += f", {_count(status.hang_requeues, 'hang')}"
        if status.node_failures or status.excluded_nodes:
            line += (f", {_count(status.node_failures, 'bad-node requeue')}; excluded nodes: "
                     f"{', '.join(status.excluded_nodes or []) or 'none'}")
        return line


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class SlurmBackend(Backend):
    name = "slurm"
    id_name = "a Slurm job id"
    id_example = "a number, e.g. 12345, or 123_4 for an array task"
    drill_faults = (*FAULTS_HERE, "node")  # slurm/faults.py: as Slurm delivers them, and a node set DOWN

    def __init__(self, watcher: SlurmWatcher | None = None):
        self.watcher = watcher or WATCHER

    def claims(self, ref: str) -> bool:
        """A Slurm job id (123) or array task id (123_4)."""
        head, sep, task = str(ref).partition("_")
        return head.isdigit() and (task.isdigit() or not sep)

    def plan(self, spec_or_sweep, run_dir=None, max_parallel: int | None = None):
        """The batch script, rendered and checked by bash (a sweep: its configurations and every job
        array's script, at the cluster's MaxArraySize)."""
        if isinstance(spec_or_sweep, JobSpec):
            from .submission import BatchPlan

            return BatchPlan(spec_or_sweep, RunDirectory.preview(spec_or_sweep, run_dir).path, run_dir)
        from .array import SweepPlan

        return SweepPlan(spec_or_sweep, run_dir, max_parallel)

    def start_plan(self, plan, files: dict[str, bytes] | None = None, check: bool = True, **options) -> SlurmJob:
        """Submit the plan's script (the cluster check first, unless check=False); returns the handle."""
        spec = plan.subject
        warnings, expedite = [], False
        if check:  # with the cluster's partitions and nodes, its requeue policy (--no-check: plain --requeue)
            from .fit import refuse_if_it_cannot_fit

            warnings = refuse_if_it_cannot_fit([spec])
            expedite = bool(spec.slurm.max_requeues) and self.requeue_policy(spec).expedite
        run = RunDirectory.create(spec, plan.requested)
        run.write_files(files)
        job = SlurmJob(submit_job(spec, run, plan, expedite=expedite), run, self.watcher)
        job.warnings = warnings
        return job

    def start_sweep(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print, check: bool = True):
        """One job array per set of identical #SBATCH lines; returns (sweep directory, array ids)."""
        from .array import submit_sweep
        from ...sweeps.directory import SweepDirectory

        warnings = []
        if check:
            from .fit import refuse_if_it_cannot_fit

            distinct = {c.spec.to_json(exclude=("params", "name", "env")): c.spec for c in sweep.configurations}
            warnings = refuse_if_it_cannot_fit(list(distinct.values()))
        for warning in warnings:
            echo(f"warning: {warning}")
        directory = SweepDirectory.create(sweep, run_dir, backend="slurm")
        return directory, submit_sweep(sweep, directory, max_parallel or sweep.base.max_parallel, echo=echo)

    def start_map(self, sweep, files: list[dict[str, bytes]], max_parallel: int | None = None,
                  check: bool = True) -> list[SlurmJob]:
        """One job array (or several, past MaxArraySize) over the configurations; task i gets `files[i]`."""
        from .array import submit_sweep
        from ...sweeps.directory import SweepDirectory

        if check:
            from .fit import refuse_if_it_cannot_fit

            refuse_if_it_cannot_fit([sweep.base])
        directory = SweepDirectory.create(sweep, None, backend="slurm")
        for (_, run), task_files in zip(directory.task_runs(), files):
            run.write_files(task_files)
        submit_sweep(sweep, directory, max_parallel, echo=lambda message: None)
        return [SlurmJob(task["job_id"], run, self.watcher) for task, run in directory.task_runs()]

    def find(self, job_id, run: RunDirectory | None = None, whole_array: bool = False) -> SlurmJob:
        """A handle on job `job_id` (an array task: 123_4). An array's own id names a sweep: a
        UsageError says how to name one task, unless `whole_array` (to cancel them all)."""
        job_id = str(job_id)
        if run is None:
            entry = index.lookup(job_id)
            if entry is not None and "sweep_dir" in entry:
                if whole_array:
                    return SlurmJob(job_id, None, self.watcher)
                raise UsageError(f"job {job_id} is the job array of the sweep in {entry['sweep_dir']}.\n"
                                 f"  fix: name one task as {job_id}_N, or see them all with "
                                 f"`jaxlaunch status {job_id} -v`.")
            if entry is not None:
                run = RunDirectory(entry["run_dir"])
            else:
                run = self._run_dir_from_slurm([job_id]).get(job_id)
        return SlurmJob(job_id, run, self.watcher)

    def find_many(self, job_ids: list[str]) -> list[SlurmJob]:
        """Handles on many jobs, their run directories from jaxlaunch's index; no scheduler call
        (see `fill_run_dirs` for jobs the index does not know)."""
        jobs = []
        for job_id in job_ids:
            entry = index.lookup(job_id)
            run = RunDirectory(entry["run_dir"]) if entry and "run_dir" in entry else None
            jobs.append(SlurmJob(job_id, run, self.watcher))
        return jobs

    def fill_run_dirs(self, jobs: list[SlurmJob]) -> None:
        """Run directories of jobs the index does not know but Slurm does, from ONE scontrol call."""
        missing = [job for job in jobs if job.run is None and job.info() is not None]
        if missing:
            found = self._run_dir_from_slurm([job.id for job in missing])
            for job in missing:
                job.run = found.get(job.id)

    def _run_dir_from_slurm(self, job_ids: list[str]) -> dict[str, RunDirectory]:
        """Run directories of jobs jaxlaunch's index does not know, from Slurm's StdOut path."""
        argv = ["scontrol", "show", "job", "--oneliner", *(job_ids if len(job_ids) == 1 else [])]
        try:
            out = scheduler.call_slurm(argv)
        except scheduler.SlurmUnreachable:
            raise  # said once, at once: not asked again by the next lookup
        except SchedulerError:
            return {}
        found = {}
        for line in out.splitlines():
            record = scheduler.parse_scontrol_record(line)
            if record.get("JobId") in job_ids and record.get("StdOut"):
                run = RunDirectory(Path(record["StdOut"]).parent)
                if run.spec_file.exists():
                    found[record["JobId"]] = run
        return found

    def find_to_cancel(self, ref: str) -> SlurmJob:
        """An array's own id gives a handle on every task of it."""
        return self.find(ref, whole_array=True)

    def states(self, jobs: list[Job]) -> dict[str, JobState]:
        self.watcher.refresh([job.id for job in jobs])
        return {job.id: job.state() for job in jobs}

    # --- jaxlaunch status: status.py ------------------------------------------------------

    def listed(self):
        """The newest jobs and sweeps in jaxlaunch's index (a sweep whose folder is gone is left out)."""
        from .status import listed_ids, split_sweeps

        sweeps, ids = split_sweeps(listed_ids(), skip_missing=True)
        return sweeps, self.find_many(ids)

    def unlisted(self) -> int:
        from .status import LISTED

        return max(0, len(index.known_job_ids()) - LISTED)

    def resolve(self, refs: list[str]):
        from .status import split_sweeps

        sweeps, ids = split_sweeps(refs)
        return sweeps, self.find_many(ids)

    def status_rows(self, jobs):
        from .status import job_rows

        return job_rows(self, jobs)

    def sweep_states(self, directory):
        from .array_status import task_states

        return task_states(directory)

    def not_asked_line(self, error: Exception) -> str:
        if not isinstance(error, SchedulerError):
            return super().not_asked_line(error)
        from .status import listed_ids, not_asked_line, split_sweeps

        sweeps, ids = split_sweeps(listed_ids(), skip_missing=True)
        return not_asked_line([*(str(d.path) for d in sweeps), *ids], error)

    def unknown_ids_message(self, ids: list[str]) -> str:
        from .status import unknown_ids_message

        return unknown_ids_message(ids)

    # --- jaxlaunch explain and doctor: explain.py, fit.py, doctor.py -----------------------------

    def placement(self, spec):
        from .explain import placement

        return placement(spec)

    def check_fit(self, spec):
        """Partitions, nodes, CPUs, GPUs, memory and time limit, from two scontrol calls."""
        from .fit import check_against_cluster

        return check_against_cluster(spec)

    def requeue_policy(self, spec):
        """The cluster's expedited requeue and requeue delay (one `scontrol show config`), for a job that may requeue."""
        from .requeue_policy import read_policy

        return read_policy() if spec.slurm.max_requeues else None

    def fit_verdict(self, problems, warnings):
        from .explain import fit_verdict

        return fit_verdict(problems, warnings)

    def container_command(self, spec, run_dir, workdir) -> str:
        from .explain import container_command

        return container_command(spec, Path(run_dir), Path(workdir))

    def inject_fault(self, fault, job_id, run_dir, rank, processes_per_node):
        from .faults import inject

        return inject(fault, job_id, run_dir, rank, processes_per_node)

    def end_fault(self, node):
        from .faults import resume_node

        resume_node(node)

    def start_doctor_checks(self, env):
        from .doctor import start_checks

        return start_checks(env)
