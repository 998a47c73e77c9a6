"""Faults that `jaxlaunch drill` injects into a job whose ranks run on this machine, for any backend
that starts them here (the local one, the test suite's fake): a rank's process found by the run
directory it carries (JAXLAUNCH_RUN_DIR) and its rank variable, then SIGKILL (`kill`) or SIGSTOP
(`hang`); a preemption notice is SIGUSR2 to the job's supervisor (`preempt`). A Slurm job's nodes run
the same search in a step of the job: `python -m launcher.backends.faults signal RUN_DIR RANK SIGNUM`
(slurm/faults.py)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ..launchers.rank_variables import RANK_NUMBER

# The faults inject_here delivers; `repeat` needs no injection (the drill plants it in the rank).
HERE = ("kill", "preempt", "hang", "repeat")


class FaultNotInjected(Exception):
    """Why a fault could not be injected (the drill scores the trial with it)."""


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The process of rank `rank` of the job's current attempt: the one mpirun, prterun or srun
    started (mpirun's or srun's variable). A process the rank forked (a ProcessPoolExecutor's
    worker, a DataLoader's) inherits the rank's variables, so the rank is the one whose parent does
    not carry them; the newest such, when an earlier attempt's is still there."""
    from ..supervisor.processes import is_output_pump, job_processes

    for variable in RANK_NUMBER:
        pids = job_processes(run_dir, {variable: str(rank)})
        pids = [pid for pid in pids if is_python(pid) and not is_output_pump(pid)]
        started_by_launcher = [pid for pid in pids if parent_pid(pid) not in pids]
        if started_by_launcher:
            return max(started_by_launcher, key=start_ticks)
    return None


def parent_pid(pid: int) -> int | None:
    return _stat_field(pid, 1)


def start_ticks(pid: int) -> int:
    """When the process started (clock ticks after boot): pids wrap, start times do not."""
    return _stat_field(pid, 19) or 0


def _stat_field(pid: int, index: int) -> int | None:
    """A field of /proc/PID/stat after the command name (0: the state, 1: the parent, 19: the start time)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[index])
    except (OSError, ValueError, IndexError):
        return None


def is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False


def signal_rank_here(run_dir: Path, rank: int, signum: int) -> bool:
    """Signal rank `rank` of the job in `run_dir` if its process runs on this machine."""
    pid = rank_pid(run_dir, rank)
    if pid is None:
        return False
    os.kill(pid, signum)
    return True


def inject_here(fault: str, run_dir: Path, rank: int, supervisor_pid: int | None) -> None:
    """kill or hang a rank running on this machine, or send its supervisor a preemption notice.
    FaultNotInjected says why it could not be."""
    if fault == "preempt":
        if not supervisor_pid:
            raise FaultNotInjected("the job's supervisor process is not known")
        try:
            os.kill(supervisor_pid, signal.SIGUSR2)
        except ProcessLookupError:
            raise FaultNotInjected(f"the job's supervisor (pid {supervisor_pid}) is gone") from None
        return
    if fault not in ("kill", "hang"):
        raise FaultNotInjected(f"{fault}: not a fault this backend can inject")
    if not signal_rank_here(Path(run_dir), rank, signal.SIGKILL if fault == "kill" else signal.SIGSTOP):
        raise FaultNotInjected(f"rank {rank}'s process was not found")


def _main(argv: list[str]) -> int:
    """`python -m launcher.backends.faults signal RUN_DIR RANK SIGNUM`: one task of the drill's step
    on a Slurm node."""
    if len(argv) != 4 or argv[0] != "signal":
        print("usage: python -m launcher.backends.faults signal RUN_DIR RANK SIGNUM", file=sys.stderr)
        return 2
    if signal_rank_here(Path(argv[1]), int(argv[2]), int(argv[3])):
        print(f"signalled rank {argv[2]} on {os.uname().nodename}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
