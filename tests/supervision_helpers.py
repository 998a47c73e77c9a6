"""Running a misbehaving job and checking how it ended: shared by the local and Slurm tests."""

import json
import os
import signal
import time
from pathlib import Path

from launcher.supervisor.processes import job_processes

# how -> what failure.json's first failure must say (its error, signal or exit code)
FAIL_FAST = {
    "raise": "RuntimeError: rank 1 failed on purpose",
    "exit3": "SystemExit: sys.exit(3) called",
    "segfault": "SIGSEGV",
    "os_exit0": "without",  # mpirun: "exited without MPI_Finalize"; srun: "vanished without a trace"
    "sigkill": "SIGKILL",
}


def wait_for_file(path: Path, timeout: float, process=None) -> float:
    """Wait until `path` exists; returns the time it appeared (its mtime)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process is None or process.poll() is None, f"the job ended before {path} appeared"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)
    return path.stat().st_mtime


def control_records(run_dir: Path, kind: str) -> dict[int, dict]:
    """What the ranks told the supervisor in the last attempt (logs/control.json), by rank."""
    records = json.loads((Path(run_dir) / "logs" / "control.json").read_text())
    return {record["rank"]: record for record in records[kind]}


def rank_pid(run_dir: Path, rank: int) -> int:
    """The PID of `rank`, found by the run directory and the rank in its environment."""
    for variable in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        pids = [p for p in job_processes(run_dir, {variable: str(rank)})
                if b"launcher.rank.bootstrap" in Path(f"/proc/{p}/cmdline").read_bytes()]
        if pids:
            return pids[0]
    raise AssertionError(f"no process of rank {rank} found for {run_dir}")


def misbehave(run_dir: Path, how: str, timeout: float = 60) -> float:
    """Wait until the bad rank (1) is about to misbehave; for `sigkill`, kill it from outside.
    Returns the time of the failure."""
    failed_at = wait_for_file(run_dir / "ready-rank-1", timeout)
    if how == "sigkill":
        os.kill(rank_pid(run_dir, 1), signal.SIGKILL)
        failed_at = time.time()
    return failed_at


def assert_no_process_survives(run_dir: Path, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while job_processes(run_dir):
        assert time.monotonic() < deadline, f"processes of the job survive: {job_processes(run_dir)}"
        time.sleep(0.1)


def assert_root_cause(run_dir: Path, how: str, rank: int = 1) -> dict:
    failure = json.loads((run_dir / "failure.json").read_text())
    first = failure["first_failure"]
    assert failure["state"] == "FAILED", failure
    assert first["rank"] == rank, failure
    expected = FAIL_FAST[how]
    cause = f"{first['error']} {first.get('signal')} {first.get('exit_code')}"
    assert expected in cause, failure
    if how == "exit3":
        assert first["exit_code"] == 3
    if how == "segfault":
        assert first["signal"] == expected
    if how == "sigkill" and first["signal"] is None:
        # mpirun on several nodes: the peer's MPI library may notice the loss before mpirun
        # reports the signal, so only "vanished" is known (with SIGKILL named as a possibility)
        assert first["error"].startswith("vanished without a trace"), first
    assert [r["rank"] for r in failure["failed_ranks"]] == [rank], failure
    assert failure["torn_down_ranks"] == [r for r in range(2) if r != rank]
    return failure
