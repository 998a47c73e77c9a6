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
(allocation.py), which the backend provides; the supervisor names no scheduler.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from ..channel import PreemptNotice, StopRequest
from .channel import ControlServer, left_early
from ..rundir import RunDirectory, atomic_write_json
from ..owner_key import owner_key
from ..environment import ATTEMPT_ENV, OWNER_KEY_ENV
from ..spec import JobSpec
from ..states import CANCEL_EVENT, EXIT_COMPLETED, EXIT_FAILED, EXIT_PREEMPTED, EXIT_TIMEOUT, Cause, JobState
from .. import stragglers
from .allocation import Allocation
from . import governor, root_cause, rollcall
from .watchdog import HangWatchdog, describe_setting
from .processes import kill_job_processes
from .report import describe_outcome, result_text, write_to_stderr, write_to_stdout
from .streams import LauncherOutput, StreamForwarder, forward

POLL_SECONDS = 0.1
ANSWER_SECONDS = 3.0      # how long ranks get to dump their stacks before the job is ended
TERMINATE_SECONDS = 5.0   # SIGTERM to the launcher's process group, then SIGKILL
# After the launcher reported a rank dead, it must exit within this long: prterun has been seen
# to hang for good after ranks died in MPI_Init (PMIX_ERR_UNREACH), a job that would never end.
LAUNCHER_EXIT_SECONDS = 10.0
# Open MPI's words for a rank that died inside MPI_Init. prterun does not report such a rank as
# dead, and under load it was seen to hang for good after both ranks died that way (1 run in 7).
MPI_INIT_FAILED = re.compile(r"error occurred in MPI_Init|MPI_INIT failed|abort before MPI_INIT", re.IGNORECASE)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

NOTICE_SIGNAL = signal.SIGUSR2
# Why the supervisor stopped a job -> the job's state.
STOP_STATES = {Cause.TIMEOUT: JobState.TIMEOUT, Cause.COLLECTIVE_TIMEOUT: JobState.TIMEOUT, Cause.HANG: JobState.TIMEOUT,
               Cause.LEFT_EARLY: JobState.FAILED, Cause.CANCELLED: JobState.CANCELLED}
# A job that has not reported this long after its ranks started is told, once, that the hang
# watchdog waits for its first ctx.report() (until then only timeout and collective_timeout apply).
UNARMED_NOTE_SECONDS = 60.0
STILL_WRITE_SECONDS = 5.0  # how often status.json learns how long each rank has stood still
NO_RESTART = (Cause.TIMEOUT, Cause.CANCELLED)  # the job's time is spent, or the user asked to stop


@dataclass
class Outcome:
    state: JobState
    exit_code: int
    failure: dict | None
    attempts: int               # attempts this run directory has seen (ctx.attempt + 1 of the last)
    restarts: int | None = None  # restarts after a failure in this launch (None: attempts - 1)


def ended_well(dones: list[dict], spec: JobSpec, has_result: bool) -> JobState | None:
    """The state of an attempt whose launcher exited 0, from the ranks' done records: PREEMPTED
    when they stopped after a notice (a checkpoint written), COMPLETED when every rank finished;
    None when not every rank said it was done (then it failed). A function's ranks stop together
    at should_stop(); a script or module got the notice as its signal, which its own handler may
    have acted on at any rank. A function's result is its return value (rank 0 writes it last);
    a program has none."""
    if len(dones) != spec.num_processes:
        return None
    stopped = any if spec.runs_program else all
    if stopped(d.get("stopped") for d in dones):
        return JobState.PREEMPTED
    if spec.runs_program or has_result:
        return JobState.COMPLETED
    return None


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


class Supervisor:
    def __init__(self, spec: JobSpec, run: RunDirectory, argv: list[str], env: dict[str, str],
                 echo=print, write_output=write_to_stderr, allocation: Allocation | None = None,
                 resume: bool = False, write_stdout=write_to_stdout):
        self.spec, self.run, self.argv, self.env = spec, run, argv, env
        self.echo, self.write_output, self.write_stdout = echo, write_output, write_stdout
        self.stop_signal: int | None = None
        self.cancelled_by: str | None = None  # _cancelled_by's words, found once
        self.deadline = None
        # Where the job runs: this machine, or a scheduler's allocation (a Slurm batch job).
        self.allocation = allocation or Allocation()
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
        previous = self._install_signal_handlers()
        try:
            attempt = first
            swaps = 0  # attempts started on spare nodes: not restarts (max_restarts)
            failing_check = self.allocation.failing_nodes(self.spec, self.run, self.echo)
            if failing_check and self.allocation.swap_in_spares(failing_check, Cause.HEALTH_CHECK, attempt, self.run,
                                                                self.spec, self.echo):
                failing_check = {}
            while not failing_check:
                self.run.update_status(state=JobState.RUNNING, attempts=attempt + 1, restarts=attempt - first - swaps,
                                       started=started, attempt_started=time.time())
                attempt_started = time.time()
                state, failure, stop_reason = self._attempt(attempt)
                if state == JobState.PREEMPTED:
                    state, failure = self._after_preemption(failure)
                    break
                lost = self.allocation.lost_nodes() if state == JobState.FAILED and stop_reason is None else {}
                if state != JobState.COMPLETED:
                    why = self._repeated_failure(attempt, failure, stop_reason, attempt_started, lost)
                    if why is not None:
                        failure = self._governed(failure, why)
                        break
                culprits = {} if lost else self._hang_culprit_nodes(stop_reason, failure)
                bad, cause = (lost, Cause.NODE_FAILURE) if lost else (culprits, Cause.HANG)
                # A spare node of the allocation takes the bad node's place: the next attempt starts
                # at once, from the latest checkpoint, and counts against no restart budget.
                if bad and self.allocation.swap_in_spares(bad, cause, attempt, self.run, self.spec, self.echo):
                    self._archive_attempt(attempt)
                    attempt += 1
                    swaps += 1
                    continue
                if bad:  # the allocation is smaller now: only a requeue can give the job its nodes back
                    state, failure = self._leave_nodes_behind(bad, cause, failure, attempt)
                    break
                if (state == JobState.COMPLETED or stop_reason in NO_RESTART
                        or attempt - first - swaps >= self.spec.max_restarts):
                    break
                self.echo(f"jaxlaunch: attempt {attempt} {state}: {failure['summary']}")
                self.echo(f"jaxlaunch: restarting the job ({attempt - first - swaps + 1} of {self.spec.max_restarts} "
                          f"restarts)")
                self._archive_attempt(attempt)
                attempt += 1
            if failing_check:
                attempt -= 1  # no attempt ran
                state, failure = self._leave_nodes_behind(failing_check, Cause.HEALTH_CHECK, None, first)
        finally:
            self._restore_signal_handlers(previous)
        state = JobState.parse(state)
        if state in (JobState.COMPLETED, JobState.PREEMPTED, JobState.REQUEUED):
            self.run.failure_file.unlink(missing_ok=True)
        exit_code = exit_code_for(state, self.stop_signal)
        if state == JobState.FAILED and self.spec.runs_program:
            exit_code = _program_exit_code(failure) or exit_code
        reason = None if failure is None else failure["summary"]
        self.run.update_status(state=state.value, exit_code=exit_code, ended=time.time(), reason=reason)
        self.allocation.finish(self.run, state, self.requeue_cause, self.echo)
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

    def _leave_nodes_behind(self, bad: dict[str, str], cause: str, failure: dict | None, attempt: int
                            ) -> tuple[JobState, dict | None]:
        """The allocation gives the job its nodes back without `bad` (node: why): REQUEUED, or
        FAILED when it cannot."""
        state, failure = self.allocation.leave_nodes_behind(bad, cause, failure, attempt, self.run, self.spec,
                                                            self.echo)
        if state == JobState.REQUEUED:
            self.requeue_cause = cause
        return state, failure

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
        if (self.allocation.can_swap_in_spares(self.spec, self.run, set(nodes))
                or self.allocation.can_leave_nodes_behind(self.spec, self.run, set(nodes))):
            return nodes
        return {}

    def _continue_earlier_run(self) -> "int | Outcome":
        """Pick up where the run directory's last attempt ended: its logs go to logs/attempt-K/,
        attempt numbers (ctx.attempt) go on. In a requeued batch job, count requeues Slurm made
        without us (a preemption that killed the job before it could stop) and end the job if
        the limit is spent. Returns the first attempt number, or the final Outcome."""
        attempts = self.run.status().attempts
        if attempts:
            self._archive_attempt(attempts - 1)
        failure = self.allocation.requeues_spent(self.run, self.spec, attempts, self.echo)
        if failure is not None:  # requeued too often: end before starting anything
            return Outcome(JobState.FAILED, EXIT_FAILED, failure, attempts, restarts=0)
        if attempts:
            self.run.log_event("resumed", attempt=attempts, restart_count=self.allocation.restart_count())
        return attempts

    def _install_signal_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, self._on_signal)
        previous[NOTICE_SIGNAL] = signal.signal(NOTICE_SIGNAL, self._on_notice)
        return previous

    def _on_notice(self, signum, frame) -> None:
        # Only note it: the poll loop tells the ranks (file I/O does not belong in a handler).
        self.notice_time = self.notice_time or time.time()

    def _send_notice(self) -> None:
        """Tell every rank (read by each rank's monitor thread)."""
        self.notice_sent = True
        self.channel.send_preempt_notice(PreemptNotice(NOTICE_SIGNAL.name, self.notice_time))
        self.run.log_event("notice", source="supervisor", signal=NOTICE_SIGNAL.name, received=self.notice_time)
        how = "at their next ctx.should_stop()"
        if self.spec.preemption_signal:
            how += f", and to the program's own handler as {self.spec.preemption_signal} (preemption_signal)"
        elif self.spec.runs_program:
            how += ", which the program sees only through launcher.context(); preemption_signal is unset"
        self.echo(f"jaxlaunch: {NOTICE_SIGNAL.name} received: asking the ranks to checkpoint and stop ({how})")

    # --- after a preemption notice ------------------------------------------------------------

    def _notice_sources(self) -> set[str]:
        sources = set()
        channel = self.channel  # None before the first attempt
        for record in channel.notices() if channel else []:
            sources.update(record.get("sources", []))
        for record in channel.done() if channel else []:
            sources.update((record.get("stopped") or {}).get("sources", []))
        if self.notice_time is not None:
            sources.add("supervisor")
        return sources

    def _after_preemption(self, failure: dict | None) -> tuple[JobState, dict | None]:
        """The ranks stopped on a notice (or were ended by a preemption): CANCELLED when somebody
        cancelled the job, else what the allocation makes of it (locally PREEMPTED, to resume
        with `run --resume`; a Slurm job REQUEUED, or FAILED once its requeues are spent)."""
        sources = self._notice_sources()
        checkpointed = failure is None
        self.run.log_event("stopped", sources=sorted(sources), at_agreed_point=checkpointed)
        if self._cancel_requested():
            # A scheduler's cancel sends the ranks the SIGTERM a preemption sends: they stopped at
            # an agreed step, but the person asked for the job to end, not to come back.
            self.run.log_event("cancelled", at_agreed_point=checkpointed)
            return JobState.CANCELLED, failure
        state, failure, self.requeue_cause = self.allocation.after_notice(self.run, self.spec, sources, checkpointed,
                                                                          self.echo)
        return state, failure

    @staticmethod
    def _restore_signal_handlers(previous) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum

    def _archive_attempt(self, attempt: int) -> None:
        """Move this attempt's logs and records to logs/attempt-K/."""
        folder = self.run.logs / f"attempt-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        for path in list(self.run.logs.iterdir()):
            if path.is_file():
                path.rename(folder / path.name)
        if self.run.failure_file.exists():
            self.run.failure_file.rename(folder / self.run.failure_file.name)

    # --- one attempt -----------------------------------------------------------------------

    def _attempt(self, attempt: int) -> tuple[str, dict | None, str | None]:
        self.run.logs.mkdir(parents=True, exist_ok=True)
        self.watchdog = HangWatchdog(self.spec.hang_timeout, size=self.spec.num_processes)
        self.channel = ControlServer(self.run, self.control_host, size=self.spec.num_processes,
                                     watchdog=self.watchdog).start()
        self.run.log_event("attempt_started", attempt=attempt)  # the goodput timeline (launcher/goodput.py)
        self.run.log_event("watchdog", hang_timeout=self.spec.hang_timeout,
                           collective_timeout=self.spec.collective_timeout)
        ended = None
        try:
            ended = self._run_attempt(attempt)
            return ended
        finally:
            self.run.log_event("attempt_ended", attempt=attempt, state=None if ended is None else ended[0])
            self.channel.close()
            if self.channel.straggler is not None:
                host = self.channel.host_of(self.channel.straggler["rank"])
                self.echo(f"jaxlaunch: slow rank: {stragglers.describe(self.channel.straggler, host)}")
            try:
                self.channel.save_records()
            except OSError:
                pass

    def _run_attempt(self, attempt: int) -> tuple[str, dict | None, str | None]:
        env = {**os.environ, **self.env, ATTEMPT_ENV: str(attempt), **self.channel.env(),
               OWNER_KEY_ENV: owner_key()}
        argv = self.allocation.launch_command(self.argv, self.spec, self.run)
        if argv != self.argv:
            self.run.log_event("launch", argv=argv)
        process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        said = LauncherOutput(self.run.launcher_log)
        launcher_lines = said.lines
        # A program's stdout is this process's stdout, as under `mpirun python prog.py`; a
        # function's stdout is its result line, so its ranks' stdout joins their stderr.
        to_stdout = self.write_stdout if self.spec.runs_program else self.write_output
        readers = [threading.Thread(target=forward, daemon=True, name=f"jaxlaunch-launcher-{name}",
                                    args=(stream, StreamForwarder(write, said, self.spec.output)))
                   for name, stream, write in (("stdout", process.stdout, to_stdout),
                                               ("stderr", process.stderr, self.write_output))]
        for reader in readers:
            reader.start()
        stop_reason, detail = None, ""
        seen_lines, rank_reported_dead = 0, None
        still_due = time.monotonic() + STILL_WRITE_SECONDS
        while process.poll() is None:
            if self.notice_time is not None and not self.notice_sent:
                self._send_notice()
            stop_reason, detail = self._why_stop()
            if stop_reason is not None:
                self._stop_job(process, stop_reason, detail, attempt)
                break
            if rank_reported_dead is None and len(launcher_lines) != seen_lines:
                seen_lines = len(launcher_lines)
                text = "\n".join(launcher_lines)
                if (root_cause.parse_launcher_messages(text, self.allocation.task_reports)[0]
                        or MPI_INIT_FAILED.search(text)):
                    rank_reported_dead = time.monotonic()
            if rank_reported_dead is not None and time.monotonic() - rank_reported_dead > LAUNCHER_EXIT_SECONDS:
                self.echo(f"jaxlaunch: the launcher reported a rank dead but did not exit within "
                          f"{LAUNCHER_EXIT_SECONDS:g} s; ending it")
                self.run.log_event("launcher_hung", seconds=LAUNCHER_EXIT_SECONDS)
                self._terminate(process)
                break
            if time.monotonic() >= still_due:  # how long each rank has stood still, for `jaxlaunch status`
                still_due = time.monotonic() + STILL_WRITE_SECONDS
                still = self.watchdog.last_moved()
                if still:
                    self.run.update_status(still={str(r): s for r, s in sorted(still.items())}, still_at=time.time())
            # Wakes at once on a rank's message, else after POLL_SECONDS to see if the launcher ended.
            self.channel.changed.wait(POLL_SECONDS)
            self.channel.changed.clear()
        process.wait()
        if stop_reason is None and self.stop_signal is not None:
            # The signal reached the launcher too (scancel signals every process of the job) and
            # it ended before our loop saw the signal: still a cancellation, not a failure.
            stop_reason, detail = self._why_stop()
        for reader in readers:
            reader.join(timeout=5)
        said.close()
        # What the ranks left running (a program's child, a pool's workers): named, then ended with
        # the job, as mpirun ends its ranks.
        kill_job_processes(self.run.path, on_found=lambda found: self.run.log_event("processes_left", processes=found))

        if stop_reason is None and process.returncode == 0:
            ended = ended_well(self.channel.done(), self.spec, self.run.result_file.exists())
            if ended is not None:
                return ended, None, None
        state = STOP_STATES.get(stop_reason, JobState.FAILED)
        failure = self._failure(state, stop_reason, detail, process.returncode, list(launcher_lines),
                                said.first_seen or time.time(), attempt)
        atomic_write_json(self.run.failure_file, failure)
        if self.allocation.job_id is not None and state != JobState.TIMEOUT and self._ended_by_preemption():
            # The scheduler's preemption (or a notice that killed mpirun's daemons) ended the job
            # before it could stop: it still counts as preempted, and resumes from its latest
            # periodic checkpoint.
            return JobState.PREEMPTED, failure, None
        return state, failure, stop_reason

    def _ended_by_preemption(self) -> bool:
        if self._cancel_requested():
            return False  # the ranks' SIGTERM notice came from the cancel
        return bool(self._notice_sources()) or self.allocation.ended_by_preemption()

    def _cancel_requested(self) -> bool:
        """Somebody cancelled this job: `jaxlaunch cancel` (which writes a `cancel_requested` event
        before it signals), or a cancel in the scheduler, as the allocation sees it. Slurm sends a
        cancel the same SIGTERM as a preemption, so the signal alone cannot tell."""
        if any(event.get("event") == CANCEL_EVENT and event.get("time", 0) >= self.launched
               for event in self.run.read_events()):
            return True
        return self.allocation.cancelled_outside()

    def _cancelled_by(self) -> str:
        """Who ended the job, in words: `jaxlaunch cancel`, Ctrl-C, or the signal."""
        if self.cancelled_by is None:
            if self._cancel_requested():
                self.cancelled_by = "cancelled with jaxlaunch cancel"
            elif self.stop_signal == signal.SIGINT:
                self.cancelled_by = "cancelled by Ctrl-C (SIGINT)"
            else:
                self.cancelled_by = f"cancelled by {signal.Signals(self.stop_signal).name}"
        return self.cancelled_by

    def _why_stop(self) -> tuple[str | None, str]:
        if self.stop_signal is not None:
            return Cause.CANCELLED, self._cancelled_by()
        if self.deadline is not None and time.monotonic() > self.deadline:
            return Cause.TIMEOUT, f"timed out after {self.spec.timeout} s (the spec's timeout)"
        early = left_early(self.channel.waiting(), self.channel.done())
        if early is not None:  # a peer that left main is the cause, even past collective_timeout
            self.channel.note_abort(early)
            return early.reason, early.message
        requests = self.channel.abort_requests()
        if requests:
            first = min(requests, key=lambda r: r["time"])
            return first["reason"], first["message"]
        hung = self.watchdog.check()
        if hung is not None:
            return Cause.HANG, hung
        self._note_unarmed_watchdog()
        return None, ""

    def _note_unarmed_watchdog(self) -> None:
        """Say once what watches a job that has not reported: the ranks' stacks."""
        if self.unarmed_noted or self.spec.hang_timeout is None or self.watchdog.reported:
            return
        started = [r["time"] for r in self.channel.started()]
        if len(started) < self.spec.num_processes or time.time() - max(started) < UNARMED_NOTE_SECONDS:
            return
        self.unarmed_noted = True
        self.echo(f"jaxlaunch: no ctx.report() from the job in its first {UNARMED_NOTE_SECONDS:.0f} s: the hang "
                  f"watchdog follows the ranks' stacks (hang_timeout: {describe_setting(self.spec.hang_timeout)})")

    def _stop_job(self, process, reason: str, detail: str, attempt: int) -> None:
        """Ask every rank for its stacks and state, wait briefly for the answers, then end the job."""
        self.echo(f"jaxlaunch: stopping the job: {detail}; collecting every rank's stacks")
        asked = time.time()
        self.channel.request_stop(StopRequest(reason, asked, detail=detail, attempt=attempt))
        deadline = time.monotonic() + ANSWER_SECONDS
        while time.monotonic() < deadline and process.poll() is None:
            answered = {s["rank"] for s in self.channel.rank_states() if s.get("time", 0) >= asked}
            # A rank that has left main cannot answer: its monitor thread ended with the interpreter.
            answered |= {d["rank"] for d in self.channel.done()}
            if len(answered) >= self.spec.num_processes:
                break
            self.channel.changed.wait(POLL_SECONDS)
            self.channel.changed.clear()
        self._terminate(process)

    @staticmethod
    def _terminate(process) -> None:
        """SIGTERM the launcher's process group (mpirun then ends its ranks), SIGKILL after a grace."""
        for sig, wait in ((signal.SIGTERM, TERMINATE_SECONDS), (signal.SIGKILL, None)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _failure(self, state, stop_reason, detail, returncode, launcher_lines, first_seen, attempt) -> dict:
        # After a stop of our own, what the launcher says about ranks is our teardown, not a cause.
        reports, every_task = ([], False) if stop_reason else root_cause.parse_launcher_messages(
            "\n".join(launcher_lines), self.allocation.task_reports)
        rank_errors = self.run.rank_error_records()
        finished = {d["rank"] for d in self.channel.done()}
        started = {r["rank"]: r["host"] for r in self.channel.started()}
        reason = stop_reason or Cause.FAILED
        if reason == Cause.FAILED and not reports and not rank_errors:
            detail = (f"the launcher exited with code {returncode} and no rank reported an error"
                      if returncode else "the launcher exited without an error, but not every rank finished main "
                                         "or rank 0 wrote no result")
        return root_cause.build_failure(
            state=state, reason=reason, num_processes=self.spec.num_processes, rank_errors=rank_errors,
            abort_requests=self.channel.abort_requests(),
            launcher_reports=reports, reports_every_task=every_task, finished_ranks=finished,
            started_ranks=started,
            rank_states=self.channel.rank_states() if stop_reason else [],
            log_tail=self.run.rank_log_tail, launcher_exit_code=returncode, attempt=attempt, seen_at=first_seen,
            detail=detail, launcher_tail=launcher_lines)


def supervise(spec: JobSpec, run: RunDirectory, argv: list[str], env: dict[str, str], echo=print,
              write_output=write_to_stderr, allocation: Allocation | None = None, resume: bool = False,
              write_stdout=write_to_stdout) -> Outcome:
    """Run the job under supervision until it ends; see the module doc."""
    return Supervisor(spec, run, argv, env, echo, write_output, allocation, resume, write_stdout).supervise()


__all__ = ["EXIT_COMPLETED", "EXIT_FAILED", "EXIT_PREEMPTED", "EXIT_TIMEOUT", "Outcome", "Supervisor",
           "describe_outcome", "exit_code_for", "result_text", "supervise"]
