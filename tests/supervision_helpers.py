"""Running a misbehaving job and checking how it ended: shared by the local and Slurm tests. Also
the unit tier's harness for the real Supervisor loop (below `FAKE_LAUNCHER`): a small script that
stands in for mpirun and its ranks, the fixtures and the run it supervises."""

import importlib
import json
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.backends.slurm import fit, requeue
from launcher.environment import RUN_DIR_ENV
from launcher.errors import SchedulerError
from launcher.launchers.rank_variables import MPIRUN, PMIX_RANK
from launcher.rundir import RunDirectory
from launcher.spec import JobSpec
from launcher.spec.model import SlurmSpec
from launcher.supervisor.processes import job_processes
from launcher.supervisor.supervise import Supervisor

attempt_module = importlib.import_module("launcher.supervisor.attempt")  # one attempt: where its timings are read

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
    for variable in (MPIRUN.rank, PMIX_RANK):  # mpirun's ranks, srun's (its PMIx sets PMIX_RANK)
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


# --- the unit tier's supervisor harness ---------------------------------------------------------

# Stands in for `mpirun ... bootstrap`: argv[1] says how the "ranks" behave this attempt. Each
# fake rank speaks the real control protocol (launcher/channel.py) to the supervisor.
FAKE_LAUNCHER = r'''
import json, os, signal, sys, time
from pathlib import Path

from launcher.rank.channel import ControlClient

run = Path(os.environ["JAXLAUNCH_RUN_DIR"])
ranks = int(os.environ["FAKE_RANKS"])
attempt = int(os.environ["JAXLAUNCH_ATTEMPT"])
mode = sys.argv[1]
if mode == "fail_first":
    mode = "fail" if attempt == 0 else "complete"
clients = {rank: ControlClient.from_env(rank) for rank in range(ranks)}


def write(path, value):
    tmp = path.parent / ("." + path.name + ".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


# What the supervisor told this attempt: its attempt number and status.json while it runs.
write(run / f"seen-attempt-{attempt}.json",
      {"attempt": attempt, "status": json.loads((run / "status.json").read_text())})
print(f"fake launcher: attempt {attempt}, {mode}", flush=True)


def done(rank, collectives=3, stopped=None):
    clients[rank].send("done", {"collectives": collectives, "time": time.time(), "stopped": stopped})
    clients[rank].close()


if mode == "complete":
    for rank in range(ranks):
        done(rank)
    write(run / "result.json", {"attempt": attempt})
elif mode == "stop":  # every rank stopped at the agreed should_stop() and checkpointed
    for rank in range(ranks):
        done(rank, stopped={"sources": ["supervisor"], "call": 4, "time": time.time()})
elif mode == "wait_for_notice":  # checkpoint and stop once the supervisor passes a notice on
    deadline = time.monotonic() + 20
    for rank in range(ranks):
        while not any(m["kind"] == "preempt" for m in clients[rank].receive(0.05)):
            if time.monotonic() > deadline:
                sys.exit("no notice came within 20 s")
        write(run / f"notice-{rank}.json", {"rank": rank})
    for rank in range(ranks):
        done(rank, stopped={"sources": ["supervisor"], "call": 4, "time": time.time()})
elif mode == "half_stopped":  # rank 0 stopped at a should_stop(), rank 1 returned as if done
    done(0, stopped={"sources": ["SIGUSR2"], "call": 4, "time": time.time()})
    done(1)
elif mode == "one_vanished":  # rank 0 finished and wrote the result; rank 1 started, never finished
    for rank in range(ranks):
        clients[rank].send("started", {"host": f"node{rank + 1}", "pid": os.getpid(), "time": time.time()})
    done(0)
    write(run / "result.json", {"attempt": attempt})
elif mode == "fail":
    write(run / "logs" / "rank-1.error.json",
          {"rank": 1, "host": "node2", "time": time.time(), "exit_code": 1, "signal": None,
           "error": f"RuntimeError: attempt {attempt} fails", "traceback": "Traceback ..."})
    sys.exit(1)
elif mode == "left_early":  # rank 1 left main after 1 collective; rank 0 waits in #2
    done(1, collectives=1)
    clients[0].send("waiting", {"seq": 2, "name": "allreduce", "since": time.time() - 1})
    time.sleep(60)
elif mode == "collective_timeout":  # rank 0's watchdog asks for the stop
    clients[0].send("waiting", {"seq": 2, "name": "allreduce", "since": time.time() - 4})
    clients[0].send("abort", {"host": "node1", "reason": mode, "time": time.time(),
                              "message": "allreduce #2 on rank 0 waited 4 s, past collective_timeout=3 s",
                              "collective": {"seq": 2, "name": "allreduce", "seconds": 4.0}, "culprit": None})
    time.sleep(60)
elif mode == "cancel_me":  # as scancel does: SIGTERM to the supervisor
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(60)
elif mode in ("scancelled", "sigterm_stop"):  # Slurm's SIGTERM (a cancel or a preemption) reached the ranks
    for rank in range(ranks):
        clients[rank].send("notice", {"rank": rank, "sources": ["SIGTERM"], "time": time.time()})
    if mode == "sigterm_stop":  # srun mode: they agreed on a step, checkpointed and returned
        for rank in range(ranks):
            done(rank, stopped={"sources": ["SIGTERM"], "call": 4, "time": time.time()})
    else:  # mpirun mode: the same signal reached the supervisor, and mpirun ended the ranks
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(60)
elif mode == "hang":
    time.sleep(60)
elif mode == "hang_after_a_rank_died":  # as prterun once did after ranks died in MPI_Init
    print("prterun detected that one or more processes exited with non-zero status,\n"
          "thus causing the job to be terminated. The first process to do so was:\n\n"
          "   Process name: [prterun-vm-22377@1,1]\n   Exit code:    14", flush=True)
    time.sleep(60)
elif mode == "hang_after_mpi_init_failed":  # prterun, under load, after both ranks died in MPI_Init
    print("*** An error occurred in MPI_Init_thread\n*** on a NULL communicator\n"
          "[vm:05560] Local abort before MPI_INIT completed completed successfully, but am not able to "
          "aggregate error messages, and not able to guarantee that all other processes were killed!", flush=True)
    time.sleep(60)
else:
    sys.exit(f"unknown mode {mode}")
'''


@pytest.fixture(scope="module")
def fake_launcher(tmp_path_factory):
    path = tmp_path_factory.mktemp("fake") / "fake_launcher.py"
    path.write_text(FAKE_LAUNCHER)
    return path


@pytest.fixture(autouse=True)
def quick_stops(monkeypatch):
    """The fake ranks never answer a stop request: do not wait the real 3 s for their stacks."""
    monkeypatch.setattr(attempt_module, "ANSWER_SECONDS", 0.2)


@pytest.fixture
def slurm(monkeypatch):
    """No Slurm here: `scontrol show job` answers `slurm.record`, `scontrol requeue` is recorded; the
    cluster's nodes cannot be read (a test that needs them fakes fit.read_cluster)."""
    state = SimpleNamespace(record={}, requeued=[], cancelled=[])

    def no_cluster():
        raise SchedulerError(["scontrol", "show", "node"], 1, "", "the unit tier asks no Slurm")
    monkeypatch.setattr(fit, "read_cluster", no_cluster)
    monkeypatch.setattr(requeue, "job_record", lambda job_id: dict(state.record))
    monkeypatch.setattr(requeue, "requeue", lambda job_id: state.requeued.append(job_id))
    monkeypatch.setattr(requeue, "cancel_in_slurm", lambda job_id: state.cancelled.append(job_id))
    monkeypatch.delenv(requeue.RESTART_COUNT_ENV, raising=False)
    return state


def make_run(tmp_path, max_requeues=3, **fields) -> tuple[JobSpec, RunDirectory]:
    spec = JobSpec(name="units", entrypoint="job.py:main", processes_per_node=2,
                   slurm=SlurmSpec(max_requeues=max_requeues), **fields)
    return spec, RunDirectory.create(spec, tmp_path / "run")


def supervisor(fake_launcher, spec, run, mode, **kw) -> Supervisor:
    echoed = []
    sup = Supervisor(spec, run, [sys.executable, str(fake_launcher), mode],
                     {RUN_DIR_ENV: str(run.path), "FAKE_RANKS": str(spec.num_processes)},
                     echo=echoed.append, write_output=lambda data: None, **kw)
    sup.echoed = echoed
    return sup


def seen(run, attempt) -> dict:
    """What attempt `attempt` saw: its JAXLAUNCH_ATTEMPT and status.json while it ran."""
    return json.loads((run.path / f"seen-attempt-{attempt}.json").read_text())


def status(run) -> dict:
    return run.read_status()


def end_time(seconds_from_now: float) -> str:
    """An EndTime as `scontrol show job` prints it (local time)."""
    return datetime.fromtimestamp(time.time() + seconds_from_now).strftime("%Y-%m-%dT%H:%M:%S")

