"""Submitting one job: its plan (the batch script, rendered and checked before anything exists),
then the script written into the run directory, sbatch, and the id recorded. Used by the Slurm
backend and, per task, by sweeps."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ...errors import SchedulerError, SpecError
from ...launchers.mpirun import find_mpirun
from ..base import Plan
from ...rundir import RunDirectory
from ...spec import JobSpec
from . import index, scheduler
from .render import SCRIPT_NAME, render_batch_script
from ...states import JobState


class BatchPlan(Plan):
    """A job's batch script, for this machine's Python, working directory and mpirun (when the
    spec launches with it: a login node without mpirun can still submit an srun job), rendered
    for `run_dir` and checked by bash. `describe()` is the script; `script_for` renders the same
    plan for another run directory (checked again), for a run that could not have the one shown.

    The plan asks Slurm nothing: `--dry-run` shows `--requeue`; `submit`'s check of the cluster
    asks, for a job that may requeue, whether it allows `--requeue=expedite` (`with_expedite`)."""

    def __init__(self, spec: JobSpec, run_dir: Path, requested=None, expedite: bool = False):
        super().__init__(spec, run_dir, requested)
        self.spec, self.expedite = spec, expedite
        self.workdir, self.python, self.is_root = Path.cwd(), sys.executable, os.geteuid() == 0
        self.mpirun = find_mpirun() if spec.slurm.launch == "mpirun" else None
        self.script = self._render(self.run_dir)

    def _render(self, run_dir: Path) -> str:
        text = render_batch_script(self.spec, run_dir=run_dir, workdir=self.workdir, python=self.python,
                                   mpirun=self.mpirun, is_root=self.is_root, expedite=self.expedite)
        check_bash_syntax(self.spec, text)
        return text

    def with_expedite(self) -> "BatchPlan":
        """This plan with `--requeue=expedite`, rendered again."""
        if self.expedite:
            return self
        plan = copy.copy(self)
        plan.expedite = True
        plan.script = plan._render(plan.run_dir)
        return plan

    def describe(self) -> str:
        return self.script

    def script_for(self, run_dir: Path) -> str:
        """The script for the run directory the job got: the one shown, when that is the one."""
        return self.script if Path(run_dir) == self.run_dir else self._render(Path(run_dir))


def render_for_submission(spec: JobSpec, run_dir: Path) -> str:
    """The batch script for this machine's Python (and mpirun, when the spec launches with it: a
    login node without mpirun can still submit an srun job). Refuses a script bash cannot parse."""
    return BatchPlan(spec, run_dir).describe()


def _bash_syntax_error(text: str, warnings: bool = False) -> str | None:
    """bash's complaint about `text` (bash -n: parse, run nothing), None if it parses. With
    `warnings`, a warning counts too (bash only warns of a here-document left open)."""
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True, timeout=30)
    if done.returncode == 0 and not (warnings and done.stderr.strip()):
        return None
    return done.stderr.strip() or f"bash -n exited {done.returncode}"


def check_bash_syntax(spec: JobSpec, text: str) -> None:
    """A `setup:` line bash cannot parse would fail only after the queue wait: refuse it now,
    naming the line. (Every other part of the script is quoted by the renderer.) The setup lines
    must also end where they end: a here-document or quote they leave open would swallow the
    launch line (`cat <<EOF`: the job never starts), though the whole script parses."""
    setup = "".join(line + "\n" for line in spec.setup)
    open_end = _bash_syntax_error(setup, warnings=True) if setup else None
    if open_end is not None and "here-document" in open_end:
        raise SpecError(f"setup: a here-document is not closed within the setup lines ({open_end.splitlines()[-1]}); "
                        f"it would swallow the launch line and the job would never start\n"
                        f"  fix: end it with its delimiter on a setup line of its own; nothing was submitted")
    error = _bash_syntax_error(text) or open_end
    if error is None:
        return
    for number, line in enumerate(spec.setup):
        line_error = _bash_syntax_error(line + "\n")
        if line_error is not None:
            message = re.sub(r"^bash: (line \d+: )?", "", line_error.splitlines()[-1])
            raise SpecError(f"setup[{number}] ({line!r}) is not valid bash: {message}\n"
                            f"  fix: correct that line of the spec's setup: list (it runs at the top of the "
                            f"batch script); nothing was submitted")
    raise SpecError(f"the rendered batch script does not parse (bash -n): {error}; nothing was submitted")


def submit_job(spec: JobSpec, run: RunDirectory, plan: BatchPlan | None = None, expedite: bool = False) -> str:
    """Write the script (`plan`'s, made for this run directory when not given) into the run
    directory and sbatch it; returns the job id. `expedite`: the cluster allows
    `--requeue=expedite` (requeue_policy.py; asked with the cluster check before submitting).

    If sbatch refuses the job, status.json says SUBMIT_FAILED with sbatch's message, and the
    error propagates: no run directory is left looking like a job that ran.
    """
    script = run.path / SCRIPT_NAME
    plan = plan or BatchPlan(spec, run.path)
    if expedite and spec.slurm.max_requeues:
        plan = plan.with_expedite()
    script.write_text(plan.script_for(run.path))
    script.chmod(0o755)
    try:
        job_id = scheduler.submit(str(script))
    except SchedulerError as exc:
        run.update_status(state=JobState.SUBMIT_FAILED.value, backend="slurm", error=str(exc), ended=time.time())
        raise
    run.update_status(state=JobState.SUBMITTED.value, backend="slurm", job_id=job_id, script=str(script),
                      submitted=time.time())
    index.record_job(job_id, run.path)
    return job_id
