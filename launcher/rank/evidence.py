"""Evidence that a rank is working though its main thread's stack stands still, read from Linux's
/proc by the rank's monitor (monitor.py) every ACTIVITY_SECONDS and sent with its `activity`:

- the CPU of its descendants: a rank that waits in `subprocess.run` on a compress-and-upload (as
  `gsutil` or `aws s3 cp` would be) uses no CPU of its own, while its child uses a whole core;
- the bytes it moves to and from storage (`/proc/self/io` read_bytes and write_bytes: a checkpoint
  write, a dataset read), and every byte its descendants read or write (an upload through a
  child). The rank's own rchar/wchar are left out: they count the monitor's own messages.

Nothing here may raise, and every figure is a running total: the monitor sends its change per
second. Elsewhere than Linux each total is 0 (no evidence, as before).
"""

from __future__ import annotations

import os
import threading

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_DESCENDANTS = 256  # a pool of workers is counted whole; a fork bomb is not walked for ever


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    """Direct children of `pid`, from every thread's `children` list (a child started from any
    thread is listed under that thread)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        found.extend(int(p) for p in _read(f"/proc/{pid}/task/{task}/children").split() if p.isdigit())
    return found


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of `pid` (this process by default), breadth first, bounded."""
    pending, found = _children(os.getpid() if pid is None else pid), []
    while pending and len(found) < _MAX_DESCENDANTS:
        child = pending.pop(0)
        if child in found:
            continue
        found.append(child)
        pending.extend(_children(child))
    return found


def _cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of a process (its reaped children's CPU included)."""
    fields = _read(f"/proc/{pid}/stat").rpartition(b")")[2].split()
    try:
        return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICKS
    except (IndexError, ValueError):
        return 0.0


def _io_fields(pid: int | str) -> dict[bytes, int]:
    fields = {}
    for line in _read(f"/proc/{pid}/io").splitlines():
        key, _, value = line.partition(b":")
        if value.strip().isdigit():
            fields[key] = int(value)
    return fields


def sample() -> tuple[float, int]:
    """(descendants' CPU seconds, bytes moved by this rank and its descendants), running totals.

    A child's CPU is counted while it lives and, once reaped, in this process's children times, so
    the total does not fall back when a child ends."""
    times = os.times()
    cpu = times.children_user + times.children_system
    own = _io_fields("self")
    moved = own.get(b"read_bytes", 0) + own.get(b"write_bytes", 0)
    for child in descendants():
        cpu += _cpu_seconds(child)
        theirs = _io_fields(child)
        moved += theirs.get(b"rchar", 0) + theirs.get(b"wchar", 0)
    return cpu, moved



def _state(path: str) -> bytes:
    fields = _read(path).rpartition(b")")[2].split()
    return fields[0] if fields else b""


def runnable() -> bool:
    """Whether a thread of this process other than the caller (the monitor), or a descendant, is
    running or waiting for a CPU (state R) now. On a loaded machine a computing thread may get less
    than half a core, so its CPU share alone would make it look idle; its state does not."""
    me = str(threading.get_native_id())
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return False
    if any(task != me and _state(f"/proc/self/task/{task}/stat") == b"R" for task in tasks):
        return True
    return any(_state(f"/proc/{child}/stat") == b"R" for child in descendants())
