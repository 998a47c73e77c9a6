"""The Slurm backend: sbatch a rendered batch script; the job's supervisor runs inside it.

SlurmBackend submits, finds and lists jobs and sweeps and hands out SlurmJob handles (job.py), which
ask Slurm through the process's one batched watcher (watcher.py).
"""

from __future__ import annotations

from pathlib import Path

from ...errors import SchedulerError, UsageError
from ...rundir import RunDirectory
from . import index, scheduler
from .job import SlurmJob
from .submission import submit_job
from .watcher import SlurmWatcher, shared_watcher
from ...spec import JobSpec
from ...states import JobState
from ..base import Backend, Fit, Job, UnknownJobsError
from ..faults import HERE as FAULTS_HERE


class SlurmBackend(Backend):
    name = "slurm"
    id_name = "a Slurm job id"
    id_example = "a number, e.g. 12345, or 123_4 for an array task"
    drill_faults = (*FAULTS_HERE, "node")  # slurm/faults.py: as Slurm delivers them, and a node set DOWN
    scheduler_name = "Slurm"
    info_fields = ("elapsed", "nodes")

    def __init__(self, watcher: SlurmWatcher | None = None):
        self.watcher = watcher or shared_watcher()

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
        missing = [job for job in jobs if job.run is None and job.slurm_record() is not None]
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

    def job_infos(self, jobs):
        from .status import job_infos

        return job_infos(self, jobs)

    def sweep_states(self, directory):
        from .array_status import task_states

        return task_states(directory)

    def unknown_jobs(self, ids):
        return UnknownJobsError(ids, self.name, self.scheduler_name, index.jobs_index(), "squeue --me")

    # --- jaxlaunch explain and doctor: explain.py, fit.py, doctor.py -----------------------------

    def placement(self, spec):
        from .explain import placement

        return placement(spec)

    def check_fit(self, spec):
        """Partitions, nodes, CPUs, GPUs, memory and time limit, from two scontrol calls."""
        from .fit import check_against_cluster

        return Fit(*check_against_cluster(spec), checked_against="the cluster")

    def requeue_policy(self, spec):
        """The cluster's expedited requeue and requeue delay (one `scontrol show config`), for a job that may requeue."""
        from .requeue_policy import read_policy

        return read_policy() if spec.slurm.max_requeues else None

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
