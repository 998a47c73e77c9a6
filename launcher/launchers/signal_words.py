"""The words for the signal that ended a rank: strsignal(3)'s descriptions, which srun prints for a
task ("task 1: Segmentation fault") and faulthandler after a crash in C ("Fatal Python error:
Segmentation fault"), and a signal's name from its number (mpirun's "exited on signal 9")."""

from __future__ import annotations

import signal as signals

SIGNAL_BY_DESCRIPTION = {"Killed": signals.SIGKILL, "Segmentation fault": signals.SIGSEGV,
                         "Floating-point exception": signals.SIGFPE,
                         "Aborted": signals.SIGABRT, "Bus error": signals.SIGBUS,
                         "Floating point exception": signals.SIGFPE, "Terminated": signals.SIGTERM,
                         "Illegal instruction": signals.SIGILL}


def signal_name(number: int) -> str:
    """'SIGKILL' for 9; 'signal 99' for a number that names no signal."""
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"
