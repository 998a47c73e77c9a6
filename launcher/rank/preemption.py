"""The rank's side of preemption: a notice flag, the signals that set it, and `should_stop()`,
which turns each rank's flag into ONE answer that every rank shares.

A notice reaches the ranks in one of three ways (see docs/design/preemption.md), and with the
spec's preemption_signal it is passed on to the program's own handler as that signal too:
- SIGUSR2 to the rank: `scancel --signal=USR2` (the job steps), or mpirun forwarding it;
- SIGTERM to the rank, once the job has called `should_stop()` (it can checkpoint): Slurm's
  preemption signals every task with SIGTERM, then SIGKILL after the partition's GraceTime;
- a message on the control channel, sent by the supervisor when IT got SIGUSR2 (sbatch --signal=B:USR2@T
  before the time limit, `scancel --batch --signal=USR2`, `kill -USR2` to `jaxlaunch run`). The
  rank's monitor thread (monitor.py) reads it.

Signals reach ranks at different moments, so a rank never acts on its own flag: `should_stop()`
is one MPI allreduce (max) of every rank's flag. All ranks get the same answer at the same step,
save the same checkpoint and return.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from .tracker import TRACKER

# Bit per source, so the agreed answer also says how the notice came.
SOURCES = {"SIGUSR2": 1, "SIGTERM": 2, "supervisor": 4}


class StopNotice:
    """This rank's preemption flag. Set from a signal handler or the monitor thread."""

    def __init__(self):
        self.sources = 0          # bits of SOURCES seen on this rank
        self.received = None      # time.time() of the first notice
        self.agreed = None        # set once should_stop() returned True: {"sources": [...], "call": n}
        self.calls = 0            # should_stop() calls so far (the same on every rank)
        self.sigterm_enabled = False
        self.stopping = False     # the supervisor is tearing the job down: SIGTERM kills again
        self.deliver = None       # spec preemption_signal: also send a notice to this process as that signal
        self.delivered = None     # {"signal": name, "sources": [...], "time": ...} once it was sent
        self.held = None          # the notice's source, while the program has no handler for that signal yet
        self._comm = None

    def set(self, source: str) -> None:
        if not self.sources:
            self.received = time.time()
        self.sources |= SOURCES[source]
        self._deliver(source)

    def _deliver(self, source: str) -> None:
        """Pass the notice on to the program's own handler (spec preemption_signal), once. Not
        when it is SIGTERM and should_stop() made SIGTERM a notice: that handler is ours, and a
        second SIGTERM to it means "end now"."""
        if self.deliver is None or self.delivered is not None:
            return
        if self.deliver == signal.SIGTERM and self.sigterm_enabled:
            return
        if not handled(self.deliver):
            # Nothing catches it yet (the program is still starting: importing, in jax.distributed's
            # initialize): its default action would end the rank, a failure instead of a stop. Held
            # until a handler is there (the monitor thread asks each poll: deliver_held).
            if self.held is None:
                self.held = source
                os.write(2, f"jaxlaunch: preemption notice held: this process does not handle "
                            f"{signal.Signals(self.deliver).name} yet (it would end it); delivered once it does\n"
                            .encode())
            return
        self.held = None
        self.delivered = {"signal": signal.Signals(self.deliver).name, "sources": [source], "time": time.time()}
        os.kill(os.getpid(), self.deliver)

    def deliver_held(self) -> None:
        """Deliver a held notice once the program handles the signal (called by the monitor thread)."""
        if self.held is not None and self.delivered is None:
            self._deliver(self.held)

    @property
    def stopped(self) -> dict | None:
        """How this rank's entrypoint was told to stop early: should_stop() returned True, or the
        notice was delivered to the program as its signal. None: it ran to its own end."""
        return self.agreed or self.delivered

    def names(self, bits: int) -> list[str]:
        return [name for name, bit in SOURCES.items() if bits & bit]


def handled(signum: int) -> bool:
    """Whether this process catches `signum`: a handler in Python or in C (JAX's preemption notifier
    installs its SIGTERM handler in C, where signal.getsignal does not see it). The kernel's SigCgt
    mask holds both; without /proc, Python's own view."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return signal.getsignal(signum) not in (signal.SIG_DFL, None)


NOTICE = StopNotice()


def _on_usr2(signum, frame) -> None:
    NOTICE.set("SIGUSR2")


def _on_term(signum, frame) -> None:
    # A second SIGTERM, or one while the supervisor ends the job, means "go now".
    if NOTICE.stopping or NOTICE.sources & SOURCES["SIGTERM"]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    NOTICE.set("SIGTERM")


def install_usr2_handler() -> None:
    """At rank start: SIGUSR2 is a notice, never the default action (which ends the process)."""
    signal.signal(signal.SIGUSR2, _on_usr2)


def _enable_sigterm_notice() -> None:
    """A job that calls should_stop() can checkpoint, so Slurm's preemption SIGTERM becomes a
    notice for it. Jobs that never call it keep SIGTERM's default: they end at once."""
    if not NOTICE.sigterm_enabled and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_term)
        NOTICE.sigterm_enabled = True


def _agreement_comm():
    if NOTICE._comm is None:
        from mpi4py import MPI

        NOTICE._comm = MPI.COMM_WORLD.Clone()  # collective: every rank makes its first call together
    return NOTICE._comm


def should_stop() -> bool:
    """True on every rank, at the same call, once any rank has had a preemption notice.

    Call it once per step, on every rank, outside jit. When it returns True, save a checkpoint
    and return from main: the run then ends PREEMPTED (and requeues on Slurm) instead of COMPLETED.
    """
    import numpy as np

    _enable_sigterm_notice()
    mine = np.array([NOTICE.sources], dtype=np.int32)
    agreed = np.zeros(1, dtype=np.int32)
    seq = TRACKER.start("should_stop")
    TRACKER.enter(seq, "should_stop")
    try:  # the first _agreement_comm() is collective (a Clone): inside, so a rank that never comes is named
        _agreement_comm().Allreduce(mine, agreed, op=_bitwise_or())
    finally:
        TRACKER.leave()
    NOTICE.calls += 1
    if agreed[0] and NOTICE.agreed is None:
        NOTICE.agreed = {"sources": NOTICE.names(int(agreed[0])), "call": NOTICE.calls, "time": time.time()}
    return bool(agreed[0])


def _bitwise_or():
    from mpi4py import MPI

    return MPI.BOR
