"""What the control channel (launcher/channel.py) promises a real job under mpirun: no filesystem
polling by an idle rank, ranks that stop when their supervisor dies. The channel itself, on real
sockets, is in tests/unit/test_control_channel.py."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TEST_JOBS
from launcher.supervisor.processes import job_processes
from supervision_helpers import rank_pid, wait_for_file

SPEC = TEST_JOBS / "misbehave.yaml"
JAXLAUNCH = str(Path(sys.executable).parent / "jaxlaunch")


def strace_file_calls(pid: int, seconds: float, out: Path) -> list[str]:
    """Every syscall that names a file, made by `pid` (all its threads) during `seconds`."""
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-e", "trace=%file", "-o", str(out), "-p", str(pid)],
                              stderr=subprocess.PIPE)
    time.sleep(seconds)
    tracer.send_signal(signal.SIGINT)
    _, err = tracer.communicate(timeout=10)
    if "Operation not permitted" in err.decode():
        pytest.skip(f"strace may not attach here: {err.decode().strip()}")
    return out.read_text().splitlines() if out.exists() else []


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_an_idle_rank_makes_no_filesystem_calls_on_the_run_directory(tmp_path):
    """The issue's bound: 0 metadata operations on the run directory by an idle rank in 10 s (the file
    channel this replaced made ~100: stop.json and preempt.json, 5 times a second). Rank 1 sleeps in
    main, rank 0 waits for it in an allreduce."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(SPEC), "--run-dir", str(run_dir),
                                "--set", "params.how=hang", "--set", "params.seconds=40"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_file(run_dir / "ready-rank-1", 90, process)
        time.sleep(1.5)  # past the wait report of rank 0's collective
        calls = {rank: strace_file_calls(rank_pid(run_dir, rank), 10, tmp_path / f"strace-{rank}.txt")
                 for rank in (0, 1)}
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
    for rank, lines in calls.items():
        on_run_dir = [line for line in lines if str(run_dir) in line]
        assert on_run_dir == [], f"rank {rank} touched the run directory: {on_run_dir[:5]}"


def test_ranks_stop_soon_after_their_supervisor_is_killed(tmp_path):
    """kill -9 of `jaxlaunch run` leaves mpirun and the ranks (they run in a session of their own):
    they see the connection end, and are gone within ORPHAN_EXIT_SECONDS and a few seconds more."""
    from launcher.rank.monitor import ORPHAN_EXIT_SECONDS

    run_dir = tmp_path / "run"
    process = subprocess.Popen([JAXLAUNCH, "run", str(SPEC), "--run-dir", str(run_dir),
                                "--set", "params.how=hang", "--set", "params.seconds=120"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_file(run_dir / "ready-rank-1", 90, process)
        assert job_processes(run_dir)
        process.kill()
        process.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + ORPHAN_EXIT_SECONDS + 20
        while job_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = job_processes(run_dir)
    finally:
        for pid in job_processes(run_dir):
            os.kill(pid, signal.SIGKILL)
    assert left == [], "the job ran on without its supervisor"
    logs = "".join((run_dir / "logs" / f"rank-{r}.log").read_text() for r in (0, 1))
    assert "lost its supervisor (the supervisor closed the connection)" in logs
