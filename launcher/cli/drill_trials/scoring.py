"""A trial's score from its run directory (detected, recovered, steps lost, the same result),
the scorecard and drill.json. A mixin of Drill (trials.py)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ...states import JobState
from .blame import judge_blame
from .runs import Trial, read_events, read_reports, read_status, same_result

class DrillScores:
    def score_repeat(self, trial: Trial, run_dir: Path) -> None:
        """PASS: the hang was stopped, and the governor ended the job after the second attempt."""
        events = read_events(run_dir)
        ends = [e for e in events if e["event"] == "attempt_ended"]
        stopped = next((e for e in events if e["event"] == "governor" and e.get("decision") == "stopped"), None)
        trial.faulted_state = ends[0].get("state") if ends else None
        trial.detected = bool(ends) and trial.faulted_state not in (None, JobState.COMPLETED)
        if trial.detected:
            trial.detect_seconds = round(ends[0]["time"] - trial.injected_at, 2)
            judge_blame(trial, run_dir, ends[0])
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

    def steps_lost_from_output(self, trial: Trial, run_dir: Path, events: list[dict], ended: dict) -> None:
        """A program that reports no steps: steps computed again from what it printed, or unknown."""
        from .printed_steps import printed_loss

        attempts = sorted({e["attempt"] for e in events if e["event"] == "attempt_started"})
        if len(attempts) < 2:
            return  # not restarted: nothing computed again
        loss = printed_loss(run_dir, attempts, ended.get("attempt", attempts[0]))
        if loss is None:
            trial.steps_lost_from = "unknown"
            trial.notes.append("steps lost unknown: the program reports no steps (ctx.report) and its output names "
                               "none ('step N')")
            return
        trial.steps_lost, trial.steps_lost_from = loss.steps, "output"
        if loss.started_over:
            trial.why.append(f"the job started over after the restart: at least {loss.steps} steps computed again "
                             f"(from its output: {loss.detail}); it does not resume from a checkpoint")
        elif loss.steps:
            trial.notes.append(f"at least {loss.steps} steps computed again, read from its output ({loss.detail}); "
                               f"its checkpoints are its own, so the drill cannot judge their interval")

    def score(self, trial: Trial, run_dir: Path) -> None:
        from ...rundir.goodput import goodput
        from ...rundir.results import load_result

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
                judge_blame(trial, run_dir, ended)
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
        interval = self.clean["checkpoint_interval"]
        if self.clean["steps"]:
            try:
                trial.steps_lost, trial.steps_lost_from = goodput(run_dir).steps_recomputed, "reports"
            except (OSError, ValueError, KeyError):
                trial.steps_lost = None
        elif ended is not None:
            self.steps_lost_from_output(trial, run_dir, events, ended)
        if trial.steps_lost and trial.steps_lost_from == "output" and interval is None:
            pass  # judged from the output (steps_lost_from_output): its checkpoints are the program's own
        elif trial.steps_lost:
            if interval is None:
                trial.why.append(f"{trial.steps_lost} steps computed again: the job never checkpoints")
            elif trial.steps_lost > interval:
                trial.why.append(f"{trial.steps_lost} steps computed again, more than its checkpoint interval "
                                 f"({interval} steps)")
        if trial.final_state == JobState.COMPLETED:
            from ...rundir import RunDirectory

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
                 "-" if t.recover_seconds is None else f"{t.recover_seconds} s",
                 "unknown" if t.steps_lost_from == "unknown" else shown(t.steps_lost),
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
                "clean": self.clean, "workdir": self.workdirs.report() if self._workdirs is not None else None,
                "trials": [asdict(t) for t in self.trials], "passed": all(t.passed for t in self.trials)}
