"""The supervisor's signals: SIGTERM, SIGHUP or SIGINT stop the job (the attempt sees `stop_signal`),
and SIGUSR2 is a preemption notice, passed on to every rank over the control channel; after the
ranks stopped on it, what that leads to is the allocation's to say (after_preemption). A mixin of
Supervisor (supervise.py): it uses the supervisor's run, spec, channel and allocation."""

from __future__ import annotations

import signal
import threading
import time

from ..channel import PreemptNotice
from ..states import JobState

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
NOTICE_SIGNAL = signal.SIGUSR2


class SignalsAndNotices:
    def install_signal_handlers(self):
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

    def send_notice(self) -> None:
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

    def notice_sources(self) -> set[str]:
        sources = set()
        channel = self.channel  # None before the first attempt
        for record in channel.notices() if channel else []:
            sources.update(record.get("sources", []))
        for record in channel.done() if channel else []:
            sources.update((record.get("stopped") or {}).get("sources", []))
        if self.notice_time is not None:
            sources.add("supervisor")
        return sources

    def after_preemption(self, failure: dict | None) -> tuple[JobState, dict | None]:
        """The ranks stopped on a notice (or were ended by a preemption): CANCELLED when somebody
        cancelled the job, else what the allocation makes of it (locally PREEMPTED, to resume
        with `run --resume`; a Slurm job REQUEUED, or FAILED once its requeues are spent)."""
        sources = self.notice_sources()
        checkpointed = failure is None
        self.run.log_event("stopped", sources=sorted(sources), at_agreed_point=checkpointed)
        if self.cancel_requested():
            # A scheduler's cancel sends the ranks the SIGTERM a preemption sends: they stopped at
            # an agreed step, but the person asked for the job to end, not to come back.
            self.run.log_event("cancelled", at_agreed_point=checkpointed)
            return JobState.CANCELLED, failure
        state, failure, self.requeue_cause = self.allocation.after_notice(sources, checkpointed)
        return state, failure

    @staticmethod
    def restore_signal_handlers(previous) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
