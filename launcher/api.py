"""The Python API for scripts and notebooks: start a job, get a handle, follow it.

    import launcher

    job = launcher.run("jobs/normalize.yaml", overrides=["nodes=2"])     # local, under mpirun
    job.wait()                     # "COMPLETED", "FAILED", "TIMEOUT", ...
    job.result()                   # what the entrypoint returned (launcher.load_result)

    job = launcher.submit("jobs/train_data_parallel.yaml")              # Slurm
    job.state(); job.logs(rank=0); job.cancel(); job.failure()

A local job runs in a process of its own (`python -m launcher.background RUN_DIR`), so the
caller's process (a notebook kernel) keeps its signal handlers and never imports JAX for it; its
output goes to RUN_DIR/output.log. A Slurm job is what `jaxlaunch submit` makes, and its handle
answers from Slurm and the run directory, as `jaxlaunch status/logs/cancel` do.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .errors import UsageError
from .rundir import FINAL_STATES, RunDirectory

OUTPUT_LOG = "output.log"


def _load(spec, overrides):
    from .spec import JobSpec, load_spec

    if isinstance(spec, JobSpec):
        if overrides:
            raise UsageError("overrides apply to a spec file; pass the file's path, or change the JobSpec itself "
                             "(spec.replace(nodes=2, ...))")
        return spec
    return load_spec(spec, list(overrides))


class Job:
    """A handle on one run: `id`, `run_dir`, and the methods below."""

    def __init__(self, job_id: str, run: RunDirectory):
        self.id = job_id
        self.run = run

    @property
    def run_dir(self) -> Path:
        return self.run.path

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, run_dir={str(self.run_dir)!r}, state={self.state()!r})"

    def state(self) -> str:
        return self.run.read_status().get("state", "PENDING")

    def done(self) -> bool:
        return self.state() in FINAL_STATES

    def wait(self, timeout: float | None = None, poll_seconds: float = 0.5) -> str:
        """Block until the job ends (or `timeout` seconds pass: TimeoutError); its final state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.state()} after {timeout} s")
            time.sleep(poll_seconds)
        return self.state()

    def result(self):
        """What the entrypoint returned on rank 0; UsageError if the job did not complete.

        Rank 0 may have written its result before another rank failed: that job did not
        complete (`jaxlaunch run` exits non-zero for it), so its result is not handed out."""
        from .results import load_result

        state = self.state()
        if state != "COMPLETED" or not self.run.result_file.exists():
            failure = self.failure()
            why = f": {failure['summary']}" if failure else ""
            raise UsageError(f"job {self.id} has no result (state {state}){why}")
        return load_result(self.run)

    def failure(self) -> dict | None:
        """failure.json: the root cause of a failed, timed-out or cancelled job (None if none)."""
        return self.run.read_failure()

    def logs(self, rank: int | None = None) -> str:
        """Rank `rank`'s full log, or (None) the job's combined output."""
        path = self.run.rank_log(rank) if rank is not None else self._output_path()
        return path.read_text(errors="replace") if path.exists() else ""

    def _output_path(self) -> Path:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError


class LocalJob(Job):
    def __init__(self, run: RunDirectory, process: subprocess.Popen):
        super().__init__(run.path.name, run)
        self.process = process

    def _output_path(self) -> Path:
        return self.run.path / OUTPUT_LOG

    def state(self) -> str:
        state = super().state()
        returncode = self.process.poll()
        if state not in FINAL_STATES and returncode is not None:
            # The supervisor's process is gone without a final state: it was killed (kill -9, the
            # OOM killer). Its ranks would run on unsupervised: end them, and record the failure
            # so `jaxlaunch status` and later handles agree.
            from .supervisor.processes import kill_job_processes

            kill_job_processes(self.run.path)
            state = "FAILED"
            self.run.update_status(state=state, exit_code=returncode, ended=time.time(),
                                   reason=f"the job's supervisor process ended without a final state "
                                          f"(exit code {returncode})")
        return state

    def done(self) -> bool:
        return self.process.poll() is not None

    def wait(self, timeout: float | None = None, poll_seconds: float = 0.5) -> str:
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"job {self.id} still {self.state()} after {timeout} s") from None
        return self.state()

    def cancel(self) -> None:
        """SIGTERM to the job's supervisor: it stops the ranks (stack dumps in the logs) and records
        CANCELLED, as Ctrl-C or `kill` does to `jaxlaunch run`."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait()


class SlurmJob(Job):
    def _output_path(self) -> Path:
        from .slurm.jobs import log_path

        return log_path(self.id, None)

    def state(self) -> str:
        from .slurm.jobs import job_status

        info, _ = job_status(self.id)
        return info.state if info is not None else super().state()

    def done(self) -> bool:
        return self.state() in FINAL_STATES

    def cancel(self) -> None:
        from .slurm.jobs import cancel_job

        cancel_job(self.id)


def run(spec, overrides=(), run_dir=None) -> LocalJob:
    """Start `spec` (a path or a JobSpec) on this machine, as `jaxlaunch run` does; returns at once."""
    from .local import find_mpirun

    job = _load(spec, overrides)
    find_mpirun()
    run_directory = RunDirectory.create(job, run_dir)
    with open(run_directory.path / OUTPUT_LOG, "ab") as output:
        process = subprocess.Popen([sys.executable, "-m", "launcher.background", str(run_directory.path)],
                                   stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return LocalJob(run_directory, process)


def submit(spec, overrides=(), run_dir=None, check: bool = True) -> SlurmJob:
    """Submit `spec` (a path or a JobSpec) to Slurm, as `jaxlaunch submit` does (the same check
    against the cluster first, unless check=False); returns the handle."""
    from .slurm.jobs import render_for_submission, submit_job

    job = _load(spec, overrides)
    render_for_submission(job, RunDirectory.preview(job, run_dir).path)  # fails before any folder exists
    warnings = []
    if check:
        from .explain import refuse_if_it_cannot_fit

        warnings = refuse_if_it_cannot_fit([job])
    run_directory = RunDirectory.create(job, run_dir)
    handle = SlurmJob(submit_job(job, run_directory), run_directory)
    handle.warnings = warnings  # what the check could not confirm (e.g. no default partition)
    return handle


def job(job_id_or_run_dir) -> Job:
    """A handle on an earlier job: a Slurm job id, or a local run's directory."""
    text = str(job_id_or_run_dir)
    if text.replace("_", "").isdigit():
        from .slurm.jobs import find_run_dir

        return SlurmJob(text, find_run_dir(text))
    run_directory = RunDirectory(text)
    if not run_directory.spec_file.exists():
        raise UsageError(f"{text} is neither a Slurm job id nor a run directory (no spec.json there)")
    return _FinishedLocalJob(run_directory)


class _FinishedLocalJob(Job):
    """A local run started elsewhere: read-only (its supervisor is not ours to wait on or stop)."""

    def __init__(self, run: RunDirectory):
        super().__init__(run.path.name, run)

    def _output_path(self) -> Path:
        return self.run.path / OUTPUT_LOG

    def cancel(self) -> None:
        raise UsageError(f"{self.run_dir} was not started by this process; stop it with kill (see "
                         f"`jaxlaunch status`) or Ctrl-C where it runs")
