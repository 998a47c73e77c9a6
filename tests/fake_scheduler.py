"""A third backend, written against the seam alone (launcher/backends/base.py and the supervisor's
Allocation), to prove that a scheduler can be added without touching jaxlaunch:
tests/e2e/test_fake_backend.py starts, follows, cancels and drills jobs through it, with the Python
API and the CLI (`jaxlaunch submit --backend fake`, `jaxlaunch drill --target fake`), registered by
JAXLAUNCH_BACKENDS=fake=fake_scheduler:FakeBackend. docs/design/add-a-backend.md walks through it.

The "scheduler" is a spool folder (FAKE_SCHEDULER_SPOOL): submitting writes a numbered record
there and starts the job's supervisor in a process of its own (`python tests/fake_scheduler.py
RUN_DIR JOB_ID`), as a batch system would start a batch script; cancelling signals that process.
Its ids look like `fake-3`. It imports nothing from launcher/backends/local/ or slurm/, and writes
none of the CLI's words: `jaxlaunch status` shows its jobs from the seam's records (Job.info's
default), and runs no sweeps (the seam's default says so).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.backends.base import Allocation, Backend, Job, Plan
from launcher.backends.faults import inject_here
from launcher.launchers.mpirun import find_mpirun, mpirun_flags
from launcher.launchers.rank_start import RANK_ENV_DEFAULTS, rank_command
from launcher.environment import RUN_DIR_ENV
from launcher.rundir import RunDirectory
from launcher.states import JobState

SPOOL_ENV = "FAKE_SCHEDULER_SPOOL"
PREFIX = "fake-"


def spool() -> Path:
    folder = Path(os.environ[SPOOL_ENV])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class FakeAllocation(Allocation):
    """The in-job side: nothing to requeue and no node to lose (the base class's answers), but
    the job id is the scheduler's own."""

    backend = "fake"

    def __init__(self, job_id: str):
        self.job_id = job_id


class FakePlan(Plan):
    def __init__(self, spec, run_dir, requested, argv: list[str], env: dict[str, str]):
        super().__init__(spec, run_dir, requested)
        self.argv, self.env = argv, env

    def describe(self) -> str:
        return (f"the fake scheduler would run, in {self.run_dir}:\n  {shlex.join(self.argv)}\n"
                + "".join(f"  {k}={v}\n" for k, v in sorted(self.env.items())))


def launch_command(spec, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """mpirun on this machine, from the launch pieces every backend shares (launcher/launchers/)."""
    argv = [find_mpirun(), *mpirun_flags(spec.num_processes, os.geteuid() == 0),
            *rank_command(spec, sys.executable, run_dir, Path.cwd())]
    return argv, {**RANK_ENV_DEFAULTS, **spec.env, RUN_DIR_ENV: str(run_dir)}


class FakeJob(Job):
    backend = "fake"

    def record(self) -> dict:
        return json.loads((spool() / f"{self.id}.json").read_text())

    def state(self) -> JobState:
        """status.json's, while the job's first process (its supervisor) lives; its last word after."""
        status = self.status()
        if not status.state.final:
            try:
                os.kill(self.record()["pid"], 0)
            except ProcessLookupError:
                return self.status().state
            except PermissionError:
                pass
        return status.state

    def logs(self, rank: int | None = None) -> str:
        path = self.rank_log(rank) if rank is not None else self.run.path / "fake-scheduler.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def cancel(self) -> None:
        """What a batch system does: SIGTERM to the job's first process (its supervisor)."""
        try:
            os.kill(self.record()["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass


class FakeBackend(Backend):
    name = "fake"
    id_name = "a fake scheduler job id"
    id_example = "fake-3"
    # what `jaxlaunch drill --target fake` may inject (no preempt: this scheduler never requeues, so a
    # preempted job would stay PREEMPTED)
    drill_faults = ("kill", "hang", "repeat")

    def inject_fault(self, fault, job_id, run_dir, rank, processes_per_node):
        """The ranks run on this machine: launcher's own injection, with this scheduler's record of
        the job's first process (its supervisor)."""
        inject_here(fault, Path(run_dir), rank, json.loads((spool() / f"{job_id}.json").read_text())["pid"])
        return None

    def claims(self, ref: str) -> bool:
        return ref.startswith(PREFIX) and ref[len(PREFIX):].isdigit()

    def find(self, ref, run: RunDirectory | None = None) -> Job:
        ref = str(ref)
        record = spool() / f"{ref}.json"
        if not self.claims(ref) or not record.exists():
            raise self.unknown_jobs([ref])
        return FakeJob(ref, run or RunDirectory(json.loads(record.read_text())["run_dir"]))

    def plan(self, spec, run_dir=None, max_parallel=None) -> Plan:
        run = RunDirectory.preview(spec, run_dir)
        argv, env = launch_command(spec, run.path)
        return FakePlan(spec, run.path, run_dir, argv, env)

    def start_plan(self, plan: Plan, files=None, **options) -> Job:
        run = RunDirectory.create(plan.subject, plan.requested)
        run.write_files(files)
        job_id = f"{PREFIX}{len(list(spool().glob(f'{PREFIX}*.json'))) + 1}"
        run.update_status(backend=self.name, job_id=job_id, state=JobState.PENDING.value, submitted=time.time())
        with open(run.path / "fake-scheduler.out", "ab") as out:
            child = subprocess.Popen([sys.executable, __file__, str(run.path), job_id], stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        (spool() / f"{job_id}.json").write_text(json.dumps({"run_dir": str(run.path), "pid": child.pid}))
        return FakeJob(job_id, run)


def main(argv: list[str]) -> int:
    """The fake batch job: the supervisor, given this job's allocation."""
    from launcher.supervisor import supervise

    run = RunDirectory(argv[0])
    spec = run.read_spec()
    command, env = launch_command(spec, run.path)
    outcome = supervise(spec, run, command, env, echo=lambda m: print(m, flush=True),
                        allocation=FakeAllocation(argv[1]))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
