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


def stops(pid: int, within: float = 30.0) -> bool:
    """Whether `pid` is stopped within `within` seconds: a signal is delivered when the process is next scheduled."""
    deadline = time.monotonic() + within
    while state_of(pid) != "T":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


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
        assert stops(rank.pid), "rank 0 itself was not stopped"
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
    assert stops(rank)
    end_run(run, run_dir)
    assert said.exists() and said.read_text() == "terminated"
    assert run.returncode == 0 and job_processes(run_dir) == []


# --- every run in a fresh copy of the working directory (cli/drill_trials/workdir.py) -------------------------

# A `jaxlaunch run` that stands for a program keeping its own checkpoint in the working directory.
RESUMES_FROM_ITS_OWN_CHECKPOINT = """#!{python}
from pathlib import Path
state = Path("ckpt") / "state.txt"
print("resumed" if state.exists() else "fresh", flush=True)
state.write_text("39")
"""


def test_each_run_of_the_drill_works_in_a_fresh_copy_of_the_working_directory(tmp_path, monkeypatch):
    """Issue 51, finding 8: the preempt trial's checkpoint was picked up by the next trial ('resumed ...
    at step 39'), with no warning."""
    from launcher.cli import drill_trials
    from launcher.cli.drill_trials import clean_run

    work = tmp_path / "work"
    (work / "ckpt").mkdir(parents=True)
    (work / ".git").mkdir()
    (work / "venv").mkdir()
    (work / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    with open(work / "data.bin", "wb") as big:
        big.truncate(65 * 2**20)  # over SHARED_FILE_BYTES, and sparse
    fake = tmp_path / "jaxlaunch"
    fake.write_text(RESUMES_FROM_ITS_OWN_CHECKPOINT.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setattr(clean_run, "jaxlaunch_path", lambda: str(fake))
    monkeypatch.chdir(work)
    folder = work / "runs" / "drill-x"
    folder.mkdir(parents=True)  # as run_drill does
    drill = drill_trials.Drill("job.yaml", [], [], folder, ["kill"], 1, seed=1, tolerance=0.0)
    said = []
    for name in ("clean", "kill-1"):
        log = tmp_path / f"{name}.log"
        drill.wait_job(drill.start_job(folder / name, [], log), folder / name, 60)
        said.append(log.read_text().splitlines()[-1])
    assert said == ["fresh", "fresh"]
    assert not (work / "ckpt" / "state.txt").exists()
    assert (folder / "workdirs" / "kill-1" / "ckpt" / "state.txt").read_text() == "39"
    assert drill.workdirs.report() == {"source": str(work.resolve()), "copied": True,
                                       "shared": [".git", "data.bin", "runs", "venv"]}
    assert "shared with the original, not copied: .git, data.bin, runs, venv" in drill.workdirs.describe()
    command = (tmp_path / "kill-1.log").read_text().splitlines()[0]
    assert f" {folder / 'workdirs' / 'kill-1' / 'job.yaml'} " in command  # the spec is the copy's
