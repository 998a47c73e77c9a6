"""The local backend: the job's ranks under mpirun on this machine, its supervisor here too.

Two ways to start a job: `run_attached` supervises it in this process and streams the ranks'
output (`jaxlaunch run`); `start` runs `python -m launcher.backends.local.background RUN_DIR` in a process of its
own and returns a handle at once (`launcher.run`, local sweeps), so a notebook keeps its signal
handlers and never imports JAX for the job. Either way status.json records the supervisor's
process, so a handle found later by its run directory can tell a live run from one whose
supervisor was killed, and can cancel it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...errors import JobStateError, UsageError

LISTED_RUNS = 10  # the newest runs under runs/ that `status` lists without arguments
from ...launchers import mpirun
from . import plan as launch
from ...rundir import RunDirectory
from ...rundir.names import STATUS_FILE
from ...spec import JobSpec
from ...states import JobState
from ..base import NO_RESULT, Backend, Fit, Job, JobInfo
from ..faults import HERE as FAULTS_HERE, inject_here

RESUMABLE_STATES = (JobState.PREEMPTED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT)
CANCEL_GRACE_SECONDS = 60  # the supervisor's own stop takes ANSWER_SECONDS + TERMINATE_SECONDS


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot, /proc/PID/stat field 22): a pid and its
    start time name one process, even after the pid is reused. None for a process that is gone,
    or has exited and waits for its parent to reap it (a zombie: it runs no more, yet /proc has it;
    a `jaxlaunch run` started by a script that has not waited for it yet)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _supervisor_alive(status) -> bool | None:
    """Whether the supervisor status.json names is still running: None when it cannot be told
    (another machine, or a run from before supervisors were recorded)."""
    pid, ticks = status.supervisor_pid, status.supervisor_start
    if pid is None or status.supervisor_host != socket.gethostname():
        return None
    return _start_ticks(pid) == ticks


class _Tail:
    """The part of a growing file not printed yet (`logs -f`)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode, self.partial = path, 0, None, b""

    def new_lines(self, final: bool = False) -> str:
        """The complete lines added since the last call ("" if none); with `final`, the unfinished
        last line too (nothing will complete it)."""
        try:
            with open(self.path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                if stat.st_ino != self.inode or stat.st_size < self.offset:  # a new file in its place
                    self.inode, self.offset, self.partial = stat.st_ino, 0, b""
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            data = b""
        self.offset += len(data)
        data = self.partial + data
        cut = len(data) if final else data.rfind(b"\n") + 1
        self.partial = data[cut:]
        return data[:cut].decode(errors="replace")


class LocalJob(Job):
    backend = "local"

    def __init__(self, run: RunDirectory, process: subprocess.Popen | None = None):
        super().__init__(run.path.name, run)
        self.process = process  # the background supervisor, when this process started it

    def info(self) -> JobInfo:
        """With how long it ran (status.json) and what it returned, else its root cause: the
        columns of the local table in `jaxlaunch status`."""
        status = self.status()
        seconds = (status.ended or time.time()) - status.started if status.started else None
        try:
            result = json.loads(self.run.result_file.read_text())
        except (OSError, ValueError):
            result = NO_RESULT
        failure = self.failure() if result is NO_RESULT else None
        return JobInfo(self.id, self.backend, self.state(), self.run_dir, seconds=seconds, result=result,
                       failure=failure["summary"] if failure else "")

    def state(self) -> JobState:
        status = self.status()
        if status.state.final:
            return status.state
        if self.process is not None:
            returncode = self.process.poll()
            if returncode is None:
                return status.state
        elif _supervisor_alive(status) is not False:
            return status.state
        else:
            returncode = None
        return self._record_lost_supervisor(returncode)

    def _record_lost_supervisor(self, returncode: int | None) -> JobState:
        """The supervisor is gone without a final state: it was killed (kill -9, the OOM killer).
        Its ranks would run on unsupervised: end them, and record the failure so `jaxlaunch
        status` and every later handle agree."""
        from ...supervisor.processes import kill_job_processes

        kill_job_processes(self.run.path)
        how = "" if returncode is None else f" (exit code {returncode})"
        self.run.update_status(state=JobState.FAILED, exit_code=returncode if returncode is not None else 1,
                               ended=time.time(), reason=f"the job's supervisor process ended without a final "
                                                         f"state{how}")
        return JobState.FAILED

    def wait(self, timeout: float | None = None, on_change=None) -> JobState:
        if self.process is None or on_change is not None:
            return super().wait(timeout, on_change)
        try:
            self.process.wait(timeout=timeout)  # our own child: no polling
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"job {self.id} still {self.state()} after {timeout} s") from None
        return self.state()

    def logs(self, rank: int | None = None) -> str:
        """Rank `rank`'s log, or the combined output: a background run's output.log, else (a
        `jaxlaunch run` run, whose terminal output is not kept as one file) every rank's lines
        prefixed `[rank N]`."""
        if rank is not None:
            path = self.rank_log(rank)
            return path.read_text(errors="replace") if path.exists() else ""
        output = self.run.output_log
        if output.exists():
            return output.read_text(errors="replace")
        ranks = self.run.logged_ranks()
        parts = []
        for number in ranks:
            text = self.run.rank_log(number).read_text(errors="replace")
            parts += [f"[rank {number}] {line}\n" for line in text.splitlines()]
        return "".join(parts)

    def follow_logs(self, rank: int | None, write, poll_seconds: float = 0.5) -> None:
        """`jaxlaunch logs RUN_DIR -f`: print what `logs` prints (rank `rank`'s log; a background
        run's output.log; else every rank's lines prefixed `[rank N]`), then each new line as it
        comes, until the run has ended and no file grows. Whole lines only, so two ranks' lines
        never mix; a log that a restart moved away (logs/attempt-K/) is followed from its new start."""
        if rank is not None:
            self.rank_log(rank)  # a rank the job does not have is a UsageError now, not an empty wait
        tails: dict[Path, _Tail] = {}
        while True:
            ended = self.done()  # asked before reading: what was written before the end is read below
            grew = False
            for number, path in self._followed_logs(rank):
                text = tails.setdefault(path, _Tail(path)).new_lines(final=ended)
                if text:
                    grew = True
                    write(text if number is None else "".join(f"[rank {number}] {line}\n"
                                                              for line in text.splitlines()))
            if ended and not grew:
                return
            if not ended:
                time.sleep(poll_seconds)

    def _followed_logs(self, rank: int | None) -> list[tuple[int | None, Path]]:
        """(rank to prefix, or None; path) of the files `follow_logs` prints."""
        if rank is not None:
            return [(None, self.run.rank_log(rank))]
        output = self.run.output_log
        if output.exists():
            return [(None, output)]
        ranks = self.run.logged_ranks()
        return [(number, self.run.rank_log(number)) for number in ranks]

    def cancel(self) -> None:
        """SIGTERM to the job's supervisor: it stops the ranks (stack dumps in the logs) and records
        CANCELLED, as Ctrl-C or `kill` does to `jaxlaunch run`."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                self.process.wait()
            return
        status = self.status()
        alive = _supervisor_alive(status)
        if status.state.final:
            raise JobStateError(f"{self.run_dir} already ended ({status.state}): nothing to cancel")
        if alive is None:
            raise JobStateError(f"{self.run_dir}: its supervisor (pid {status.supervisor_pid}) runs on "
                                f"{status.supervisor_host or 'another machine'}; cancel it there")
        if alive:
            os.kill(status.supervisor_pid, signal.SIGTERM)
            deadline = time.monotonic() + CANCEL_GRACE_SECONDS
            while _supervisor_alive(self.status()) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.state()  # a supervisor that died without a word is recorded as FAILED


class LocalBackend(Backend):
    name = "local"
    drill_faults = FAULTS_HERE
    info_fields = ("seconds", "result")

    def inject_fault(self, fault, job_id, run_dir, rank, processes_per_node):
        """On this machine: the rank signalled, or SIGUSR2 to `jaxlaunch run` (the supervisor)."""
        inject_here(fault, Path(run_dir), rank, RunDirectory(run_dir).status().supervisor_pid)
        return None

    def plan(self, spec_or_sweep, run_dir=None, max_parallel: int | None = None):
        """The mpirun command and environment (a sweep: its configurations and directory)."""
        if isinstance(spec_or_sweep, JobSpec):
            return launch.LocalPlan(spec_or_sweep, RunDirectory.preview(spec_or_sweep, run_dir).path, run_dir)
        return launch.LocalSweepPlan(spec_or_sweep, run_dir, max_parallel)

    def start_plan(self, plan, files: dict[str, bytes] | None = None, **options) -> LocalJob:
        """Start the plan's spec in a background process (`python -m launcher.backends.local.background
        RUN_DIR`), which makes the same plan again from RUN_DIR's spec.json and runs it
        (`run_attached`: the same mpirun, Python and working directory, inherited)."""
        spec = plan.subject
        launch.check_local(spec)  # fails with a clear message before a run directory exists
        run = RunDirectory.create(spec, plan.requested)
        run.write_files(files)
        with open(run.output_log, "ab") as output:
            process = subprocess.Popen([sys.executable, "-m", "launcher.backends.local.background", str(run.path)],
                                       stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return LocalJob(run, process)

    def run_in_foreground(self, plan, echo=print, print_result=print) -> LocalJob:
        """`jaxlaunch run SPEC`: a new run directory for the plan's spec, then `run_attached` with
        that plan."""
        spec = plan.subject
        launch.check_local(spec)  # fails with a clear message before a run directory exists
        run = RunDirectory.create(spec, plan.requested)
        return self.run_attached(spec, run, echo=echo, print_result=print_result, plan=plan)

    def run_attached(self, spec: JobSpec, run: RunDirectory, echo=print, print_result=print,
                     resume: bool = False, plan: "launch.LocalPlan | None" = None) -> LocalJob:
        """Run the job to its end, supervised in this process; the ranks' output goes to this
        process's stderr as it comes, progress to `echo`, the result (one line of JSON) to
        `print_result`. `handle.exit_code()` is `jaxlaunch run`'s exit code. `plan`: the one
        made before the run directory was (made here when not given)."""
        from ...supervisor import describe_outcome, result_text, supervise

        plan = (plan or launch.LocalPlan(spec, run.path)).launch_plan(run.path)
        crowded = launch.oversubscribed(spec)
        if crowded:
            echo(f"jaxlaunch: warning: {crowded}")
        started = time.time()
        run.update_status(backend="local", command=plan.argv, supervisor_pid=os.getpid(),
                          supervisor_start=_start_ticks(os.getpid()), supervisor_host=socket.gethostname())
        outcome = supervise(spec, run, plan.argv, plan.env, echo=echo, resume=resume)
        for line in describe_outcome(spec, run, outcome, time.time() - started):
            echo(line)
        if outcome.state == JobState.COMPLETED:
            text = result_text(run)
            if text is not None:
                print_result(text)
        return LocalJob(run)

    def resume(self, path, echo=print, print_result=print) -> LocalJob:
        """`jaxlaunch run --resume RUN_DIR`: run the spec saved in RUN_DIR again, in RUN_DIR; the
        job's `ctx.checkpoints.restore()` finds what the earlier attempts saved."""
        from ...supervisor.processes import job_processes

        run = RunDirectory(path)
        if not run.spec_file.exists():
            raise UsageError(f"--resume {path}: not a run directory (no spec.json there)")
        state = run.status().state if run.status_file.exists() else None
        if state == JobState.COMPLETED:
            raise UsageError(f"--resume {path}: that run COMPLETED; there is nothing to continue")
        live = job_processes(run.path)
        if live:
            raise UsageError(f"--resume {path}: the run is still going (processes {', '.join(map(str, live[:5]))}); "
                             f"stop it first (kill -USR2 to checkpoint and stop)")
        echo(f"jaxlaunch: resuming {run.path} (was {state or 'unknown'})")
        return self.run_attached(run.read_spec(), run, echo=echo, print_result=print_result, resume=True)

    def start_sweep(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print, **options):
        """A local sweep runs in the foreground only (run_sweep_in_foreground)."""
        raise UsageError("the local backend runs a sweep here, in the foreground, not in the background: "
                         "`jaxlaunch run SPEC --sweep ...`")

    def run_sweep_in_foreground(self, sweep, run_dir=None, max_parallel: int | None = None, echo=print):
        """Run every configuration here, `max_parallel` at a time (each in its own process);
        returns (sweep directory, exit code: 0 only if all completed)."""
        from ...sweeps.directory import SweepDirectory
        from .array import run_sweep_locally

        mpirun.find_mpirun()
        directory = SweepDirectory.create(sweep, run_dir, backend="local")
        return directory, run_sweep_locally(directory, max_parallel or sweep.base.max_parallel or 1, echo=echo)

    def start_map(self, sweep, files: list[dict[str, bytes]], max_parallel: int | None = None) -> list[LocalJob]:
        """Every configuration in a sweep directory, run by one background process
        (`python -m launcher.backends.local.array SWEEP_DIR N`) `max_parallel` at a time (default 1)."""
        from ...sweeps.directory import SweepDirectory

        mpirun.find_mpirun()
        directory = SweepDirectory.create(sweep, None, backend="local")
        runs = [run for _, run in directory.task_runs()]
        for run, task_files in zip(runs, files):
            run.write_files(task_files)
        with open(directory.output_log, "ab") as output:
            subprocess.Popen([sys.executable, "-m", "launcher.backends.local.array", str(directory.path), str(max_parallel or 1)],
                             stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return [LocalJob(run) for run in runs]

    def find(self, run_dir, run: RunDirectory | None = None) -> LocalJob:
        """The local run in `run_dir` (UsageError when it holds no spec.json)."""
        run = run or RunDirectory(run_dir)
        if not run.spec_file.exists():
            raise UsageError(f"{run_dir} is not a run directory (no spec.json there)")
        return LocalJob(run)

    def recent(self, root: str | Path = "runs", limit: int = LISTED_RUNS) -> list[LocalJob]:
        """The newest local runs under `root` (`jaxlaunch status` without ids)."""
        jobs = [LocalJob(RunDirectory(folder)) for folder in self._run_folders(root)[:limit]]
        return [job for job in jobs if job.status().backend == "local"]

    @staticmethod
    def _run_folders(root: str | Path = "runs") -> list[Path]:
        return sorted((p.parent for p in Path(root).glob(f"*/{STATUS_FILE}")), key=lambda p: p.stat().st_mtime,
                      reverse=True)

    def unlisted(self) -> int:
        return max(0, len(self._run_folders()) - LISTED_RUNS)

    # --- jaxlaunch status, explain --------------------------------------------------------------

    def listed(self):
        """The newest local runs under runs/ (no sweeps: their tasks are one folder deeper)."""
        return [], self.recent()

    def placement(self, spec):
        return launch.placement(spec)

    def check_fit(self, spec):
        """This machine: a GPU (and JAX's CUDA plugin) for `platform: gpu`; more processes than cores."""
        return Fit(launch.problems_here(spec), [w for w in [launch.oversubscribed(spec)] if w])

    def container_command(self, spec, run_dir, workdir) -> str:
        return launch.container_command(spec, Path(run_dir), Path(workdir))
