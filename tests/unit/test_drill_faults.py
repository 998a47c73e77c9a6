"""The drill's hands on a job's processes: which process is a rank (backends/faults.py), and ending a trial's
run with a rank stopped (cli/drill_trials/runs.py, end_run). Real processes, no MPI."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launcher.environment import RUN_DIR_ENV

# A rank as a user writes it: a fork-based process pool whose workers inherit the rank's variables.
RANK_WITH_A_POOL = """
import concurrent.futures, multiprocessing, time
pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
list(pool.map(abs, range(4)))
print("ready", flush=True)
time.sleep(300)
"""


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
        except (OSError, IndexError):
            pass
    return found


def test_the_hang_fault_stops_the_rank_itself_not_a_worker_its_pool_forked(tmp_path):
    """Issue 51, finding 6: 'hang rank 0' SIGSTOPped a pool worker (the newest process with the rank's
    variables), not rank 0, and the trial still passed."""
    from launcher.backends.faults import inject_here, rank_pid

    run_dir = tmp_path / "run"
    env = {**os.environ, RUN_DIR_ENV: str(run_dir.absolute()), "OMPI_COMM_WORLD_RANK": "0"}
    rank = subprocess.Popen([sys.executable, "-c", RANK_WITH_A_POOL], env=env, stdout=subprocess.PIPE)
    try:
        assert rank.stdout.readline() == b"ready\n"
        workers = children_of(rank.pid)
        assert len(workers) >= 2, workers
        assert rank_pid(run_dir, 0) == rank.pid
        inject_here("hang", run_dir, 0, None)
        assert state_of(rank.pid) == "T"
        assert all(state_of(worker) != "T" for worker in workers)
    finally:
        for pid in [rank.pid, *children_of(rank.pid)]:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        rank.wait()


# A trial's `jaxlaunch run` as end_run sees it: a session of its own whose SIGTERM handler waits for its rank, as
# the supervisor waits for mpirun; the rank records that it acted on its SIGTERM.
RUN = """
import signal, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE)
rank.stdout.readline()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(rank.wait()))
print(rank.pid, flush=True)
while True:
    time.sleep(1)
"""
RANK_THAT_ACTS_ON_SIGTERM = """
import os, signal, sys, time
from pathlib import Path
signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[1]).write_text("terminated"), os._exit(0)))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_ending_a_trial_continues_its_stopped_rank_before_the_sigterm(tmp_path):
    """Issue 55 (runs.py:38): a stopped rank cannot act on SIGTERM; without SIGCONT first it is only
    SIGKILLed at the end (no stacks, no clean cancel), after the whole grace period."""
    from launcher.cli.drill_trials import end_run
    from launcher.supervisor.processes import job_processes

    run_dir, said = tmp_path / "run", tmp_path / "rank-said"
    env = {**os.environ, RUN_DIR_ENV: str(run_dir.absolute())}
    run = subprocess.Popen([sys.executable, "-c", RUN, RANK_THAT_ACTS_ON_SIGTERM, str(said)], env=env,
                           stdout=subprocess.PIPE, start_new_session=True)
    rank = int(run.stdout.readline())
    os.kill(rank, signal.SIGSTOP)
    while state_of(rank) != "T":
        time.sleep(0.01)
    end_run(run, run_dir)
    assert said.exists() and said.read_text() == "terminated"
    assert run.returncode == 0 and job_processes(run_dir) == []
