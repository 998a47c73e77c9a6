"""One supervisor for every job: `jaxlaunch run` calls it in-process, and a Slurm batch script runs
it as `python -m launcher.backends.slurm.batch RUN_DIR -- LAUNCH...`, so local runs and Slurm jobs stop,
report and restart the same way.

For each attempt it starts the launcher (mpirun or srun) in a session of its own, streams its
output, and watches for, whichever comes first:
- the launcher exiting (success, or a rank failed and MPI brought the job down);
- the job's `timeout` (exit code 124, with a hang report);
- a rank asking for the job to stop (collective watchdog, a rank that left `main` early);
- SIGTERM, SIGHUP or SIGINT to the supervisor (exit code 128 + signal).
SIGUSR2 is a preemption notice, not a stop: it is passed to every rank over the control channel,
which checkpoint and return at their next agreed `ctx.should_stop()`; what that leads to is the
allocation's to say (PREEMPTED for a local run; a Slurm job requeues itself).
Before a stop it asks every rank for its stacks and state (over the control channel: launcher/channel.py, this side in channel.py,
answered by each rank's monitor thread; see launcher/rank/monitor.py), then ends the launcher's process group and
any process of the job that is left on this machine. It writes failure.json and status.json, and
restarts the whole job up to `max_restarts` times after a failure.

Everything the job needs from the place it runs (the address ranks reach the supervisor at, bad or
lost nodes, what a notice or a cancel leads to, a requeue) it asks its `Allocation`
(allocation.py), which the backend provides and the Supervisor binds to the job once (spec, run
directory, echo); the supervisor names no scheduler.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from .channel import ControlServer
from ..rundir import RunDirectory, atomic_write_json
from ..spec import JobSpec
from ..states import EXIT_COMPLETED, EXIT_FAILED, EXIT_PREEMPTED, EXIT_TIMEOUT, Cause, JobState
from .allocation import Allocation, NodeAction, NodeDecision
from . import governor, rollcall
from .watchdog import HangWatchdog
from .report import describe_outcome, result_text, write_to_stderr, write_to_stdout
from .attempt import AttemptRunner
from .notices import SignalsAndNotices


NO_RESTART = (Cause.TIMEOUT, Cause.CANCELLED)  # the job's time is spent, or the user asked to stop


@dataclass
class Outcome:
    state: JobState
    exit_code: int
    failure: dict | None
    attempts: int               # attempts this run directory has seen (ctx.attempt + 1 of the last)
    restarts: int | None = None  # restarts after a failure in this launch (None: attempts - 1)



def _program_exit_code(failure: dict | None) -> int | None:
    """A script's or module's own exit code, when its sys.exit(N) or os._exit(N) failed the job
    (pytest's 1 for failed tests, 2 for a usage error...), as `python FILE` would have exited."""
    first = (failure or {}).get("first_failure") or {}
    code = first.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool) or not 0 < code < 256:
        return None
    # sys.exit(N), or a process that ended itself with code N (os._exit, C's exit) as its launcher saw it
    if first.get("kind") == "exit" or (first.get("source") == "launcher" and first.get("signal") is None):
        return code
    return None


def exit_code_for(state: str, stop_signal: int | None = None) -> int:
    """The job's exit code: the one table in launcher/states.py."""
    return JobState.parse(state).exit_code(stop_signal)


class Supervisor(SignalsAndNotices, AttemptRunner):
    """The restart policy over attempts (one attempt: attempt.py; signals and notices: notices.py)."""

    def __init__(self, spec: JobSpec, run: RunDirectory, argv: list[str], env: dict[str, str],
                 echo=print, write_output=write_to_stderr, allocation: Allocation | None = None,
                 resume: bool = False, write_stdout=write_to_stdout):
        self.spec, self.run, self.argv, self.env = spec, run, argv, env
        self.echo, self.write_output, self.write_stdout = echo, write_output, write_stdout
        self.stop_signal: int | None = None
        self.cancelled_by: str | None = None  # _cancelled_by's words, found once
        self.deadline = None
        # Where the job runs: this machine, or a scheduler's allocation (a Slurm batch job), told
        # once which job it serves.
        self.allocation = (allocation or Allocation()).bind(spec, run, echo)
        # Continue an earlier run in this run directory (`run --resume`, or a requeued batch job).
        self.resume = resume
        self.notice_time: float | None = None   # when SIGUSR2 reached the supervisor
        self.notice_sent = False
        self.control_host: str | None = None   # found when the job starts (it may ask the scheduler)
        self.channel: ControlServer | None = None  # one per attempt
        self.watchdog: HangWatchdog | None = None  # one per attempt
        self.unarmed_noted = False
        self.requeue_cause: str | None = None
        self.launched = time.time()  # events before this belong to an earlier batch job or launch

    # --- the whole job ---------------------------------------------------------------------

    def supervise(self) -> Outcome:
        started = time.time()
        if self.spec.timeout:
            self.deadline = time.monotonic() + self.spec.timeout
        self.control_host = self.allocation.control_host({**os.environ, **self.env})
        first = self._continue_earlier_run() if self.resume else 0
        if isinstance(first, Outcome):
            return first  # requeued too often: ended before starting anything
        previous = self.install_signal_handlers()
        try:
            attempt = first
            swaps = 0  # attempts started on spare nodes: not restarts (max_restarts)
            failing_check = self.allocation.failing_nodes()
            checked = self._replace_nodes(failing_check, Cause.HEALTH_CHECK, None, attempt) if failing_check else None
            if checked is not None and checked.action == NodeAction.SPARE:
                failing_check = {}
            while not failing_check:
                self.run.update_status(state=JobState.RUNNING, attempts=attempt + 1, restarts=attempt - first - swaps,
                                       started=started, attempt_started=time.time())
                attempt_started = time.time()
                state, failure, stop_reason = self.one_attempt(attempt)
                if state == JobState.PREEMPTED:
                    state, failure = self.after_preemption(failure)
                    break
                lost = self.allocation.lost_nodes() if state == JobState.FAILED and stop_reason is None else {}
                if state != JobState.COMPLETED:
                    why = self._repeated_failure(attempt, failure, stop_reason, attempt_started, lost)
                    if why is not None:
                        failure = self._governed(failure, why)
                        break
                culprits = {} if lost else self._hang_culprit_nodes(stop_reason, failure)
                bad, cause = (lost, Cause.NODE_FAILURE) if lost else (culprits, Cause.HANG)
                if bad:
                    decision = self._replace_nodes(bad, cause, failure, attempt)
                    if decision.action == NodeAction.SPARE:
                        # a spare took the bad node's place: the next attempt starts at once, from the
                        # latest checkpoint, and counts against no restart budget
                        self.archive_attempt(attempt)
                        attempt += 1
                        swaps += 1
                        continue
                    state, failure = decision.state, decision.failure  # requeued without them, or the end
                    break
                if (state == JobState.COMPLETED or stop_reason in NO_RESTART
                        or attempt - first - swaps >= self.spec.max_restarts):
                    break
                self.echo(f"jaxlaunch: attempt {attempt} {state}: {failure['summary']}")
                self.echo(f"jaxlaunch: restarting the job ({attempt - first - swaps + 1} of {self.spec.max_restarts} "
                          f"restarts)")
                self.archive_attempt(attempt)
                attempt += 1
            if failing_check:
                attempt -= 1  # no attempt ran
                state, failure = checked.state, checked.failure
        finally:
            self.restore_signal_handlers(previous)
        state = JobState.parse(state)
        if state in (JobState.COMPLETED, JobState.PREEMPTED, JobState.REQUEUED):
            self.run.failure_file.unlink(missing_ok=True)
        exit_code = exit_code_for(state, self.stop_signal)
        if state == JobState.FAILED and self.spec.runs_program:
            exit_code = _program_exit_code(failure) or exit_code
        reason = None if failure is None else failure["summary"]
        self.run.update_status(state=state.value, exit_code=exit_code, ended=time.time(), reason=reason)
        self.allocation.finish(state, self.requeue_cause)
        return Outcome(state, exit_code, failure, attempt + 1, restarts=max(0, attempt - first - swaps))

    # --- a failure that repeats (governor.py) --------------------------------------------------

    def _repeated_failure(self, attempt: int, failure: dict | None, stop_reason: str | None, started: float,
                          lost: dict) -> str | None:
        """Record how the attempt ended; why not to try again when it repeats the one before."""
        end = governor.classify(attempt, failure, stop_reason, self.run, started,
                                machine_cause=Cause.NODE_FAILURE if lost else None)
        previous = governor.previous_end(self.run, attempt)
        governor.record(self.run, end)
        if not self.spec.stop_repeated_failures:
            return None
        return governor.repeated(previous, end)

    def _governed(self, failure: dict | None, why: str) -> dict:
        """failure.json with the governor's decision: the job ends here."""
        failure = dict(failure or {})
        failure["governor"] = {"decision": "stopped", "why": why}
        failure["summary"] = f"{failure.get('summary', 'failed')}; {why}"
        atomic_write_json(self.run.failure_file, failure)
        self.run.log_event("governor", decision="stopped", why=why)
        self.echo(f"jaxlaunch: {why}")
        return failure

    # --- bad nodes ---------------------------------------------------------------------------

    def _replace_nodes(self, bad: dict[str, str], cause: str, failure: dict | None, attempt: int) -> NodeDecision:
        """The allocation's one decision for `bad` nodes (node: why), carried out here: a requeue's
        cause kept for the end, the failure written when the job ends."""
        decision = self.allocation.replace_nodes(bad, cause, failure, attempt)
        if decision.action == NodeAction.REQUEUE:
            self.requeue_cause = cause
        elif decision.action == NodeAction.END and decision.failure is not None:
            atomic_write_json(self.run.failure_file, decision.failure)
        return decision

    def _hang_culprit_nodes(self, stop_reason: str | None, failure: dict | None) -> dict[str, str]:
        """{node: why} of the ranks the roll-call named after a hang, when the allocation can requeue
        the job without them (Slurm, with requeues left); else {} (a restart or the end, as before).
        Never every node of the job: then nobody is to blame."""
        if stop_reason not in (Cause.HANG, Cause.COLLECTIVE_TIMEOUT):
            return {}
        nodes = rollcall.culprit_nodes(((failure or {}).get("hang") or {}).get("roll_call"))
        every = {r["host"] for r in self.channel.started()} if self.channel else set()
        if not nodes or (every and set(nodes) >= every):
            return {}
        if self.allocation.can_replace_nodes(set(nodes)):
            return nodes
        return {}

    def _continue_earlier_run(self) -> "int | Outcome":
        """Pick up where the run directory's last attempt ended: its logs go to logs/attempt-K/,
        attempt numbers (ctx.attempt) go on. In a requeued batch job, count requeues Slurm made
        without us (a preemption that killed the job before it could stop) and end the job if
        the limit is spent. Returns the first attempt number, or the final Outcome."""
        attempts = self.run.status().attempts
        if attempts:
            self.archive_attempt(attempts - 1)
        failure = self.allocation.requeues_spent(attempts)
        if failure is not None:  # requeued too often: end before starting anything
            return Outcome(JobState.FAILED, EXIT_FAILED, failure, attempts, restarts=0)
        if attempts:
            self.run.log_event("resumed", attempt=attempts, restart_count=self.allocation.restart_count())
        return attempts


def supervise(spec: JobSpec, run: RunDirectory, argv: list[str], env: dict[str, str], echo=print,
              write_output=write_to_stderr, allocation: Allocation | None = None, resume: bool = False,
              write_stdout=write_to_stdout) -> Outcome:
    """Run the job under supervision until it ends; see the module doc."""
    return Supervisor(spec, run, argv, env, echo, write_output, allocation, resume, write_stdout).supervise()


__all__ = ["EXIT_COMPLETED", "EXIT_FAILED", "EXIT_PREEMPTED", "EXIT_TIMEOUT", "Outcome", "Supervisor",
           "describe_outcome", "exit_code_for", "result_text", "supervise"]
