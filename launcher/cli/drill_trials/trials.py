"""The drill itself: the clean run, the plan (which fault, where, on which rank), each trial's run
with its fault injected through the target's backend, and its score; the scorecard and drill.json."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

from ...backends import RUN_DEFAULT
from .clean_run import DrillRuns
from .runs import (POINTS, POLL_SECONDS, REPEAT_RESTARTS, TRIAL_MARGIN_SECONDS, Trial, TrialTimedOut, end_run,
                   read_reports, read_status)
from .scoring import DrillScores


class Drill(DrillRuns, DrillScores):
    def __init__(self, spec_path: str, overrides: list[str], program_args: list[str], folder: Path,
                 faults: list[str], count: int, seed: int, tolerance: float, echo=print, ignore=("attempt",),
                 target: str = RUN_DEFAULT, processes_per_node: int = 1, runs_program: bool = False):
        self.target, self.processes_per_node = target, processes_per_node
        self.runs_program = runs_program  # a script or module: no ctx, its preemption is preemption_signal
        self.running: tuple[subprocess.Popen, Path] | None = None  # the run a Ctrl-C must end
        self.spec_path, self.overrides, self.program_args = spec_path, list(overrides), list(program_args)
        self.ignore = tuple(name for name in ignore if name)
        self.folder, self.faults, self.count = folder, faults, count
        self.seed, self.tolerance, self.echo = seed, tolerance, echo
        self.rng = random.Random(seed)
        self.workdir_source, self._workdirs = Path.cwd(), None  # every run gets a copy of it (workdir.py)
        self.clean: dict = {}
        self.trials: list[Trial] = []

    # --- one fault ----------------------------------------------------------------------------

    def plan(self, spec_processes: int) -> None:
        steps, checkpoints = self.clean["steps"], self.clean["checkpoints"]
        for fault in self.faults:
            for index in range(self.count):
                # repeat: a step, not a save (a save at the step would count as progress between the hangs)
                point = self.rng.choice(POINTS if checkpoints and fault != "repeat" else POINTS[:2])
                trial = Trial(fault=fault, point=point, rank=self.rng.randrange(spec_processes),
                              run_dir=str(self.folder / f"{fault}-{index + 1}"))
                if not steps:
                    trial.point = "time"
                    trial.target_seconds = round(self.rng.uniform(0.3, 0.7) * self.clean["seconds"], 2)
                elif point == "start":
                    trial.target_step = steps[0]
                elif point == "checkpoint":
                    inner = [c for c in checkpoints if c < steps[-1]] or checkpoints
                    trial.target_step = self.rng.choice(inner)
                else:
                    inner = steps[1:-1] or steps
                    trial.target_step = self.rng.choice(inner)
                self.trials.append(trial)

    def _wait_for_target(self, trial: Trial, run_dir: Path, process: subprocess.Popen, bound: float) -> bool:
        started = time.time()
        while process.poll() is None:
            if time.time() - started > bound:
                end_run(process, run_dir)
                raise TrialTimedOut(bound)
            if trial.target_step is not None:
                if any(r["step"] >= trial.target_step for r in read_reports(run_dir) if isinstance(r.get("step"), int)):
                    return True
            elif time.time() - started >= (trial.target_seconds or 0):
                return True
            time.sleep(POLL_SECONDS)
        return False

    def _inject(self, trial: Trial, run_dir: Path) -> str | None:
        """Inject the fault through the target's backend, as its scheduler would deliver it
        (backends/faults.py on this machine, backends/slurm/faults.py on Slurm); why it could not
        be, or None."""
        from ...backends import get_backend

        try:
            trial.node = get_backend(self.target).inject_fault(trial.fault, read_status(run_dir).get("job_id"), run_dir,
                                                               trial.rank, self.processes_per_node)
        except Exception as exc:  # noqa: BLE001  (FaultNotInjected, SchedulerError: the trial says why)
            return str(exc)
        return None

    def run_trial(self, trial: Trial) -> None:
        run_dir = Path(trial.run_dir)
        log = self.folder / f"{run_dir.name}.log"
        extra = []
        if trial.fault in ("kill", "hang"):
            extra.append("max_restarts=1")
        if trial.fault in ("hang", "repeat"):
            extra.append(f"hang_timeout={self.hang_limit()}")
        bound = self.trial_bound(trial.fault)
        if trial.fault == "repeat":
            self._run_repeat(trial, run_dir, log, extra, bound)
            return
        process = self.start_job(run_dir, extra, log)
        try:
            reached = self._wait_for_target(trial, run_dir, process, bound)
            if not reached:
                self.wait_job(process, run_dir, bound)
                trial.why.append("the job ended before the point chosen for the fault")
                trial.final_state = read_status(run_dir).get("state")
                return
            trial.injected_at = time.time()
            # the step the job had reached when the fault hit: the drill polls, so it may be past the target
            reached_steps = [r["step"] for r in read_reports(run_dir) if isinstance(r.get("step"), int)]
            trial.injected_step = max(reached_steps) if reached_steps else None
            problem = self._inject(trial, run_dir)
            if problem:
                trial.why.append(problem)
            try:
                code = self.wait_job(process, run_dir, bound)
            finally:
                if trial.node:  # the drill's own DOWN: give the node back to the cluster
                    from ...backends import get_backend

                    get_backend(self.target).end_fault(trial.node)
            if trial.fault == "preempt" and code == 75 and self.target == RUN_DEFAULT:  # PREEMPTED: continue it
                self.wait_job(self.start_job(run_dir, [], log, resume=True), run_dir, bound)
        except TrialTimedOut:
            trial.timed_out = True
            trial.why.append(f"the job did not end within {bound:.0f} s (twice the clean run, the fault's "
                             f"allowance and {TRIAL_MARGIN_SECONDS} s): the drill ended it")
        self.score(trial, run_dir)

    def _run_repeat(self, trial: Trial, run_dir: Path, log: Path, extra: list[str], bound: float) -> None:
        """The program's own hang, planted in the rank (rank/drill_fault.py), on every attempt."""
        from ...rank.drill_fault import HANG_ENV

        if trial.target_step is None:
            trial.why.append("repeat needs a job that reports its steps (ctx.report): this one reports none")
            return
        extra = [*extra, f"max_restarts={REPEAT_RESTARTS}", f"env.{HANG_ENV}={trial.rank}:{trial.target_step}"]
        trial.injected_at = time.time()
        trial.injected_step = trial.target_step
        try:
            self.wait_job(self.start_job(run_dir, extra, log), run_dir, bound)
        except TrialTimedOut:
            trial.timed_out = True
            trial.why.append(f"the job did not end within {bound:.0f} s: the drill ended it")
        self.score_repeat(trial, run_dir)
