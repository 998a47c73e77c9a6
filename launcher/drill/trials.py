"""The drill itself: the clean run, the plan (which fault, where, on which rank), each trial's run
with its fault injected through the target's backend, and its score; the scorecard and drill.json."""

from __future__ import annotations

import math
import random
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

from ..backends import RUN_DEFAULT
from ..states import JobState
from .runs import (HANG_FLOOR_SECONDS, POINTS, POLL_SECONDS, REPEAT_RESTARTS, TRIAL_MARGIN_SECONDS,
                   Trial, TrialTimedOut, end_run, jaxlaunch_path, read_events, read_reports, read_status,
                   same_result)


class Drill:
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
        self.clean: dict = {}
        self.trials: list[Trial] = []

    # --- running the job ----------------------------------------------------------------------

    def _start(self, run_dir: Path, extra: list[str], log: Path, resume: bool = False) -> subprocess.Popen:
        if resume:
            command = [jaxlaunch_path(), "run", "--resume", str(run_dir)]
        else:
            command = [jaxlaunch_path(), "run", self.spec_path, "--run-dir", str(run_dir)]
            if self.target != RUN_DEFAULT:  # --wait: follows the job, its restarts and requeues, to its end
                command = [jaxlaunch_path(), "submit", self.spec_path, "--backend", self.target, "--wait",
                           "--run-dir", str(run_dir)]
            for override in [*self.overrides, *extra]:
                command += ["--set", override]
            if self.program_args:
                command += ["--", *self.program_args]
        handle = open(log, "ab")
        handle.write(f"$ {' '.join(command)}\n".encode())
        handle.flush()
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        self.running = (process, run_dir)
        return process

    def _wait(self, process: subprocess.Popen, run_dir: Path, seconds: float | None) -> int:
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
        process = self._start(run_dir, [], self.folder / "clean.log")
        code = self._wait(process, run_dir, None)
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
        from ..rundir.results import load_result

        return load_result(self.clean["run_dir"])

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
        from ..backends import get_backend

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
        process = self._start(run_dir, extra, log)
        try:
            reached = self._wait_for_target(trial, run_dir, process, bound)
            if not reached:
                self._wait(process, run_dir, bound)
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
                code = self._wait(process, run_dir, bound)
            finally:
                if trial.node:  # the drill's own DOWN: give the node back to the cluster
                    from ..backends import get_backend

                    get_backend(self.target).end_fault(trial.node)
            if trial.fault == "preempt" and code == 75 and self.target == RUN_DEFAULT:  # PREEMPTED: continue it
                self._wait(self._start(run_dir, [], log, resume=True), run_dir, bound)
        except TrialTimedOut:
            trial.timed_out = True
            trial.why.append(f"the job did not end within {bound:.0f} s (twice the clean run, the fault's "
                             f"allowance and {TRIAL_MARGIN_SECONDS} s): the drill ended it")
        self._score(trial, run_dir)

    def _run_repeat(self, trial: Trial, run_dir: Path, log: Path, extra: list[str], bound: float) -> None:
        """The program's own hang, planted in the rank (rank/drill_fault.py), on every attempt."""
        from ..rank.drill_fault import HANG_ENV

        if trial.target_step is None:
            trial.why.append("repeat needs a job that reports its steps (ctx.report): this one reports none")
            return
        extra = [*extra, f"max_restarts={REPEAT_RESTARTS}", f"env.{HANG_ENV}={trial.rank}:{trial.target_step}"]
        trial.injected_at = time.time()
        trial.injected_step = trial.target_step
        try:
            self._wait(self._start(run_dir, extra, log), run_dir, bound)
        except TrialTimedOut:
            trial.timed_out = True
            trial.why.append(f"the job did not end within {bound:.0f} s: the drill ended it")
        self._score_repeat(trial, run_dir)

    def _score_repeat(self, trial: Trial, run_dir: Path) -> None:
        """PASS: the hang was stopped, and the governor ended the job after the second attempt."""
        events = read_events(run_dir)
        ends = [e for e in events if e["event"] == "attempt_ended"]
        stopped = next((e for e in events if e["event"] == "governor" and e.get("decision") == "stopped"), None)
        trial.faulted_state = ends[0].get("state") if ends else None
        trial.detected = bool(ends) and trial.faulted_state not in (None, JobState.COMPLETED)
        if trial.detected:
            trial.detect_seconds = round(ends[0]["time"] - trial.injected_at, 2)
        elif not trial.timed_out:
            trial.why.append(f"the hang was not detected: the attempt it hit ended {trial.faulted_state or 'never'}")
        trial.final_state = read_status(run_dir).get("state")
        trial.attempts = len(ends)
        if stopped is not None:
            trial.governor = stopped.get("why")
            trial.notes.append(f"the governor stopped it after {len(ends)} attempts: {stopped.get('why')}")
        elif trial.detected:
            trial.why.append(f"the same hang, at step {trial.target_step} on every attempt, was tried {len(ends)} "
                             f"times: the governor did not stop it (is stop_repeated_failures: false in the spec?)")
        if stopped is not None and len(ends) > 2:
            trial.why.append(f"the governor stopped it only after {len(ends)} attempts, not 2")
        trial.passed = not trial.why

    def _score(self, trial: Trial, run_dir: Path) -> None:
        from ..goodput import goodput
        from ..rundir.results import load_result

        events = read_events(run_dir)
        after = [e for e in events if e.get("time", 0) >= trial.injected_at]
        ended = next((e for e in after if e["event"] == "attempt_ended"), None)
        trial.faulted_state = None if ended is None else ended.get("state")
        if trial.timed_out:
            trial.detected = False
            trial.why.insert(0, f"the {trial.fault} was not detected")
        elif trial.fault == "preempt":
            stopped = next((e for e in after if e["event"] == "stopped"), None)
            trial.detected = stopped is not None and trial.faulted_state == JobState.PREEMPTED
            if stopped is not None:
                trial.detect_seconds = round(stopped["time"] - trial.injected_at, 2)
            if not trial.detected:
                fix = ("set preemption_signal (SIGTERM for orbax or JAX's preemption sync point) and checkpoint, "
                       "then exit 0, in the program's handler" if self.runs_program
                       else "does it call ctx.should_stop() and return when it is True?")
                trial.why.append(f"the job did not checkpoint and stop on the preemption notice ({fix})")
        else:
            trial.detected = ended is not None and trial.faulted_state not in (None, JobState.COMPLETED)
            if trial.detected:
                trial.detect_seconds = round(ended["time"] - trial.injected_at, 2)
            else:
                trial.why.append(f"the {trial.fault} was not detected: the attempt it hit ended "
                                 f"{trial.faulted_state or 'never'}")
        trial.final_state = read_status(run_dir).get("state")
        trial.attempts = sum(1 for e in events if e["event"] == "attempt_ended")
        if trial.final_state != JobState.COMPLETED and not trial.timed_out:
            trial.why.append(f"the job ended {trial.final_state}, not COMPLETED")
        stopped = next((e for e in after if e["event"] == "governor" and e.get("decision") == "stopped"), None)
        if stopped is not None:  # a one-off fault taken for the program's own: the governor was wrong
            trial.governor = stopped.get("why")
            trial.why.append(f"the governor did not try again: {stopped.get('why')}")
        if trial.target_step is not None and ended is not None:
            back = next((r for r in read_reports(run_dir)
                         if r["time"] > ended["time"] and isinstance(r.get("step"), int)
                         and r["step"] >= trial.target_step), None)
            if back is not None:
                trial.recover_seconds = round(back["time"] - trial.injected_at, 2)
        try:
            trial.steps_lost = goodput(run_dir).steps_recomputed
        except (OSError, ValueError, KeyError):
            trial.steps_lost = None
        interval = self.clean["checkpoint_interval"]
        if trial.steps_lost:
            if interval is None:
                trial.why.append(f"{trial.steps_lost} steps computed again: the job never checkpoints")
            elif trial.steps_lost > interval:
                trial.why.append(f"{trial.steps_lost} steps computed again, more than its checkpoint interval "
                                 f"({interval} steps)")
        if trial.final_state == JobState.COMPLETED:
            from ..rundir import RunDirectory

            has = [RunDirectory(Path(d)).result_file.exists() for d in (self.clean["run_dir"], run_dir)]
            if not any(has):  # a program that sets no result: nothing to compare, and that is no failure
                trial.notes.append("the result was not compared: neither the clean run nor this one set one "
                                   "(launcher.context().set_result)")
            else:
                try:
                    trial.same_result, where = same_result(self.clean_result(), load_result(run_dir),
                                                           self.tolerance, self.ignore)
                except Exception as exc:  # noqa: BLE001  (one result and not the other is a failure)
                    trial.same_result, where = False, f"cannot compare the results: {exc}"
                if not trial.same_result:
                    trial.why.append(f"the result differs from the clean run's: {where}")
        trial.passed = not trial.why

    # --- the whole drill ----------------------------------------------------------------------

    def scorecard(self) -> str:
        from tabulate import tabulate

        def shown(value):
            return "-" if value is None else value

        def at(trial):
            if trial.target_step is not None:
                step = trial.target_step if trial.injected_step is None else trial.injected_step
                return f"step {step} ({trial.point})"
            return f"{trial.target_seconds} s"

        rows = [["PASS" if t.passed else "FAIL", t.fault, at(t), t.rank,
                 f"{t.detect_seconds} s" if t.detected else "no", shown(t.faulted_state), shown(t.final_state),
                 "-" if t.recover_seconds is None else f"{t.recover_seconds} s", shown(t.steps_lost),
                 {True: "yes", False: "no", None: "-"}[t.same_result]]
                for t in self.trials]
        table = tabulate(rows, headers=["", "FAULT", "AT", "RANK", "DETECTED", "ATTEMPT ENDED", "FINAL", "BACK AT STEP",
                                        "STEPS LOST", "SAME RESULT"], disable_numparse=True)
        lines = [table]
        for trial in self.trials:
            for why in [*trial.why, *trial.notes]:
                lines.append(f"{trial.fault} ({Path(trial.run_dir).name}): {why}")
        return "\n".join(lines)

    def report(self) -> dict:
        return {"spec": self.spec_path, "target": self.target, "overrides": self.overrides, "args": self.program_args, "seed": self.seed,
                "count": self.count, "faults": self.faults, "tolerance": self.tolerance, "ignored": list(self.ignore),
                "clean": self.clean,
                "trials": [asdict(t) for t in self.trials], "passed": all(t.passed for t in self.trials)}
