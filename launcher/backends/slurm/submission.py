"""Submitting one job: render its batch script into the run directory, check it, sbatch it, and
record the id. Used by the Slurm backend and, per task, by sweeps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ...errors import SchedulerError, SpecError
from ..mpirun import find_mpirun
from ...rundir import RunDirectory
from ...spec import JobSpec
from . import index, scheduler
from .render import SCRIPT_NAME, render_batch_script


def render_for_submission(spec: JobSpec, run_dir: Path) -> str:
    """The batch script for this machine's Python (and mpirun, when the spec launches with it: a
    login node without mpirun can still submit an srun job). Refuses a script bash cannot parse."""
    mpirun = find_mpirun() if spec.slurm.launch == "mpirun" else None
    text = render_batch_script(spec, run_dir=run_dir, workdir=Path.cwd(), python=sys.executable,
                               mpirun=mpirun, is_root=os.geteuid() == 0)
    check_bash_syntax(spec, text)
    return text


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


def submit_job(spec: JobSpec, run: RunDirectory) -> str:
    """Write the script into the run directory and sbatch it; returns the job id.

    If sbatch refuses the job, status.json says SUBMIT_FAILED with sbatch's message, and the
    error propagates: no run directory is left looking like a job that ran.
    """
    script = run.path / SCRIPT_NAME
    script.write_text(render_for_submission(spec, run.path))
    script.chmod(0o755)
    try:
        job_id = scheduler.submit(str(script))
    except SchedulerError as exc:
        run.update_status(state="SUBMIT_FAILED", backend="slurm", error=str(exc), ended=time.time())
        raise
    run.update_status(state="SUBMITTED", backend="slurm", job_id=job_id, script=str(script),
                      submitted=time.time())
    index.record_job(job_id, run.path)
    return job_id
