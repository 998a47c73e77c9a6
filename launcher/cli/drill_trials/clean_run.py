"""The drill's runs of the job: starting one (`jaxlaunch run --backend NAME`),
waiting for it within its bound, ending it, and the clean run the trials are measured against.
A mixin of Drill (trials.py)."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path

from .runs import (HANG_FLOOR_SECONDS, TRIAL_MARGIN_SECONDS, TrialTimedOut, end_run, jaxlaunch_path, read_events,
                   read_reports, read_status)
from .workdir import WorkdirCopies


class DrillRuns:
    @property
    def workdirs(self) -> WorkdirCopies:
        if self._workdirs is None:
            self._workdirs = WorkdirCopies(self.workdir_source, self.folder)
        return self._workdirs

    # --- running the job ----------------------------------------------------------------------

    def start_job(self, run_dir: Path, extra: list[str], log: Path, resume: bool = False) -> subprocess.Popen:
        workdir = self.workdirs.for_run(run_dir)  # a fresh copy for each run; a resumption keeps its run's
        if resume:
            command = [jaxlaunch_path(), "run", "--resume", str(run_dir)]
        else:
            # in the foreground on every target: locally the job runs in that process; elsewhere run
            # follows the job, its restarts and requeues, to its end (cli/start_job.py)
            command = [jaxlaunch_path(), "run", self.workdirs.counterpart(self.spec_path, workdir),
                       "--backend", self.target, "--run-dir", str(run_dir)]
            for override in [*self.overrides, *extra]:
                command += ["--set", override]
            if self.program_args:
                command += ["--", *self.program_args]
        handle = open(log, "ab")
        handle.write(f"$ {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=workdir)
        self.running = (process, run_dir)
        return process

    def wait_job(self, process: subprocess.Popen, run_dir: Path, seconds: float | None) -> int:
        """The run's exit code; TrialTimedOut (the run ended by the drill) after `seconds`."""
        try:
            code = process.wait(seconds)
        except subprocess.TimeoutExpired:
            end_run(process, run_dir)
            raise TrialTimedOut(seconds) from None
        finally:
            if process.poll() is not None:
                self.running = None
        return code

    def end_running(self) -> Path | None:
        """End the run in progress (the drill was interrupted); its run directory, or None."""
        if self.running is None:
            return None
        process, run_dir = self.running
        end_run(process, run_dir)
        self.running = None
        return run_dir

    def trial_bound(self, fault: str) -> float:
        """How long one run of a trial may take: twice the clean run, the fault's own allowance
        (a hang: the watchdog's limit, 4x for a checkpoint, and its roll-call), and a margin."""
        allowance = 0.0
        if fault == "hang":
            allowance = 4 * self.hang_limit() + 10
        if fault == "repeat":  # two attempts, each stopped by the watchdog
            allowance = 2 * (4 * self.hang_limit() + 10)
        return 2 * self.clean["seconds"] + allowance + TRIAL_MARGIN_SECONDS

    def hang_limit(self) -> int:
        return max(HANG_FLOOR_SECONDS, math.ceil(10 * self.clean["slowest_step"]))

    def run_clean(self) -> None:
        run_dir = self.folder / "clean"
        started = time.time()
        process = self.start_job(run_dir, [], self.folder / "clean.log")
        code = self.wait_job(process, run_dir, None)
        reports = read_reports(run_dir)
        status = read_status(run_dir)
        checkpoints = sorted({e["step"] for e in read_events(run_dir) if e["event"] == "checkpoint" and "step" in e})
        steps = sorted({r["step"] for r in reports if isinstance(r.get("step"), int)})
        gaps = [b - a for a, b in zip([min(steps) if steps else 0, *checkpoints], checkpoints)] if checkpoints else []
        times = [r["time"] for r in reports]
        slowest = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        self.clean = {"run_dir": str(run_dir), "exit_code": code, "state": status.get("state"),
                      "seconds": round(time.time() - started, 2), "steps": steps, "checkpoints": checkpoints,
                      "checkpoint_interval": max(gaps) if gaps else None, "slowest_step": round(slowest, 3),
                      "main_started": next((e["time"] for e in read_events(run_dir) if e["event"] == "main_started"),
                                           started)}

    def clean_result(self):
        from ...rundir.results import load_result

        return load_result(self.clean["run_dir"])
