"""The processes of a job on this machine, found by the run directory in their environment.

Names are useless for this (every rank is `python`); the run directory is unique to a job, and
every process of it (mpirun, its daemons, the ranks) inherits JAXLAUNCH_RUN_DIR.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ..environment import RUN_DIR_ENV
from ..rank.output import PUMP_ENV


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def job_processes(run_dir: str | Path, extra: dict[str, str] | None = None) -> list[int]:
    """PIDs whose environment has JAXLAUNCH_RUN_DIR=run_dir (and every `extra` variable), except
    this process and its ancestors (the batch script that started us has the variable too)."""
    wanted = {RUN_DIR_ENV.encode(): str(Path(run_dir).absolute()).encode()}
    wanted.update({k.encode(): v.encode() for k, v in (extra or {}).items()})
    skip = _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        environ = _environ(int(entry))
        if environ and all(environ.get(k) == v for k, v in wanted.items()):
            found.append(int(entry))
    return found


def is_output_pump(pid: int) -> bool:
    """The process that passes a rank's output on (launcher/rank/output.py): it has the rank's
    variables, but it is not the rank."""
    return _environ(pid).get(PUMP_ENV.encode()) is not None


def command_line(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def kill_job_processes(run_dir: str | Path, grace: float = 2.0, on_found=None) -> list[int]:
    """SIGTERM every leftover process of the job, SIGKILL what is still there after `grace`.
    `on_found([{pid, command}])` first, when there are any (a child a program left running)."""
    pids = job_processes(run_dir)
    left = [pid for pid in pids if not is_output_pump(pid)]  # a rank's own output pump ends with it
    if left and on_found is not None:
        on_found([{"pid": pid, "command": command_line(pid)} for pid in left])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            time.sleep(0.05)
        if not pids:
            break
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class RankProcesses:
    """The states of the job's rank processes that run on this machine (/proc/PID/stat), for the
    hang watchdog: a rank stopped (T) or dead and unreaped (Z) is a hang of its own. A pid is
    taken as the rank's only once its environment shows this job's run directory (another host's
    pid, or a reused one, is left out), and read at most every `every` seconds."""

    def __init__(self, run_dir: str | Path, every: float = 1.0):
        self.wanted = str(Path(run_dir).absolute()).encode()
        self.every = every
        self._ours: dict[int, bool] = {}  # pid -> whether it is this job's
        self._next = 0.0

    def states(self, started: list[dict]) -> dict[int, str | None] | None:
        """rank -> its state letter (None: gone) for the started ranks here; None between reads."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every
        found: dict[int, str | None] = {}
        for record in started:
            pid, rank = record.get("pid"), record.get("rank")
            if not isinstance(pid, int) or not isinstance(rank, int):
                continue
            if pid not in self._ours:
                self._ours[pid] = _environ(pid).get(RUN_DIR_ENV.encode()) == self.wanted
            if self._ours[pid]:
                found[rank] = process_state(pid)
        return found


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, D, T, t, Z, ...), None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode() if fields else None
