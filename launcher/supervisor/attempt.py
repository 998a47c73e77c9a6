"""One attempt of a job, for the Supervisor (supervise.py, whose mixin this is): start the launcher
(mpirun or srun) in a session of its own, stream its output, watch for its exit, the job's timeout, a
rank's stop request, the hang watchdog and the supervisor's signals; before a stop, ask every rank
for its stacks, then end the launcher's process group and whatever of the job is left on this
machine; write the attempt's failure.json. It uses the supervisor's run, spec, allocation, channel,
watchdog and echo."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

from ..channel import StopRequest
from .channel import ControlServer, left_early
from ..rundir import atomic_write_json
from ..spec import JobSpec
from ..owner_key import owner_key
from ..environment import ATTEMPT_ENV, OWNER_KEY_ENV
from ..states import CANCEL_EVENT, Cause, JobState
from .. import stragglers
from . import root_cause
from .watchdog import HangWatchdog, describe_setting
from .processes import RankProcesses, kill_job_processes
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
# Why the supervisor stopped a job -> the job's state.
STOP_STATES = {Cause.TIMEOUT: JobState.TIMEOUT, Cause.COLLECTIVE_TIMEOUT: JobState.TIMEOUT, Cause.HANG: JobState.TIMEOUT,
               Cause.LEFT_EARLY: JobState.FAILED, Cause.CANCELLED: JobState.CANCELLED}
# A job that has not reported this long after its ranks started is told, once, that the hang
# watchdog waits for its first ctx.report() (until then only timeout and collective_timeout apply).
UNARMED_NOTE_SECONDS = 60.0
STILL_WRITE_SECONDS = 5.0  # how often status.json learns how long each rank has stood still


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


class AttemptRunner:
    def archive_attempt(self, attempt: int) -> None:
        """Move this attempt's logs and records to logs/attempt-K/."""
        folder = self.run.logs / f"attempt-{attempt}"
        folder.mkdir(parents=True, exist_ok=True)
        for path in list(self.run.logs.iterdir()):
            if path.is_file():
                path.rename(folder / path.name)
        if self.run.failure_file.exists():
            self.run.failure_file.rename(folder / self.run.failure_file.name)

    # --- one attempt -----------------------------------------------------------------------

    def one_attempt(self, attempt: int) -> tuple[str, dict | None, str | None]:
        self.run.logs.mkdir(parents=True, exist_ok=True)
        self.watchdog = HangWatchdog(self.spec.hang_timeout, size=self.spec.num_processes)
        self.rank_processes = RankProcesses(self.run.path)
        self.channel = ControlServer(self.run, self.control_host, size=self.spec.num_processes,
                                     watchdog=self.watchdog).start()
        self.run.log_event("attempt_started", attempt=attempt)  # the goodput timeline (launcher/rundir/goodput.py)
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
        argv = self.allocation.launch_command(self.argv)
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
                self.send_notice()
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
        if self.cancel_requested():
            return False  # the ranks' SIGTERM notice came from the cancel
        return bool(self.notice_sources()) or self.allocation.ended_by_preemption()

    def cancel_requested(self) -> bool:
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
            if self.cancel_requested():
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
        states = self.rank_processes.states(self.channel.started())
        if states:
            self.watchdog.process_states(states)
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
            detail=detail, launcher_tail=launcher_lines,
            named=(self.watchdog.verdict or {}).get("culprits") if stop_reason == Cause.HANG else None)
