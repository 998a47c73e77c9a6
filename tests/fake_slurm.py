"""Slurm's commands answered without Slurm, for the unit tier (which may not start them: tests/unit/guard).

Every scheduler command jaxlaunch runs goes through one door, `scheduler.call_slurm`
(launcher/backends/slurm/scheduler.py). The `fake_slurm` fixture (tests/conftest.py) puts a FakeSlurm
there, which answers each call from what the test scripted and keeps the calls:

    fake_slurm.answers["scontrol show config"] = "MaxArraySize = 3\\n"   # by the command's first words
    fake_slurm.queue["77"] = "RUNNING|0:05|2"   # what squeue lists (STATE|ELAPSED|NODES[|REASON|LIMIT])
    fake_slurm.ids = ["101", "102"]              # what each sbatch answers in turn (an exception: refused)
    fake_slurm.otherwise = REFUSED               # anything else (default: the test fails naming the call)

`write_command` is the other kind of stand-in: a Slurm command as a script on PATH, for the tests of
what call_slurm itself makes of the real commands' output and exit codes.
"""

from __future__ import annotations

from pathlib import Path

from launcher.errors import SchedulerError

# What Slurm says about a job id it does not know (scontrol show job, squeue --jobs on an older Slurm).
INVALID_JOB_ID = "slurm_load_jobs error: Invalid job id specified"


def refused(stderr: str = INVALID_JOB_ID, argv=("scontrol",)) -> SchedulerError:
    """A command that exited 1 saying `stderr`, as call_slurm raises it."""
    return SchedulerError(list(argv), 1, "", stderr)


class FakeSlurm:
    """A stand-in for scheduler.call_slurm that answers from scripted tables and records each call.

    An answer is a string (the command's stdout), an exception (raised, as call_slurm raises a
    refusal), or a function of the argv giving either. `answers` is looked up first, by the longest
    key whose words begin the argv ("scontrol show", "scontrol show config", "sbatch"); then sbatch
    takes the next of `ids` (keeping the script it was given in `scripts`), `scancel ID` is kept in
    `cancelled`, squeue lists the jobs of `queue` it is asked about (an array's id: its tasks);
    anything else gets `otherwise`, or fails the test."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}
        self.queue: dict[str, str] = {}
        self.ids: list = []
        self.otherwise: object = None
        self.calls: list[list[str]] = []
        self.scripts: list[str] = []
        self.cancelled: list[str] = []

    def __call__(self, argv, timeout=None, hint=""):
        self.calls.append(list(argv))
        answer = self._answer(list(argv))
        if callable(answer) and not isinstance(answer, BaseException):
            answer = answer(list(argv))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _answer(self, argv: list[str]):
        scripted = [key for key in self.answers if key.split() == argv[:len(key.split())]]
        if scripted:
            return self.answers[max(scripted, key=lambda key: len(key.split()))]
        if argv[0] == "sbatch" and self.ids:
            self.scripts.append(Path(argv[-1]).read_text())
            job_id = self.ids.pop(0)
            return job_id if isinstance(job_id, BaseException) else f"{job_id}\n"
        if argv[0] == "scancel" and len(argv) == 2:
            self.cancelled.append(argv[1])
            return ""
        if argv[0] == "squeue":
            asked = argv[argv.index("--jobs") + 1].split(",") if "--jobs" in argv else list(self.queue)
            listed = [job_id for job_id in self.queue if job_id in asked or job_id.split("_")[0] in asked]
            return "".join(f"{job_id}|{self.queue[job_id]}\n" for job_id in listed)  # an array's id: its tasks
        if self.otherwise is not None:
            return self.otherwise
        raise AssertionError(f"unexpected Slurm call {argv}")


def write_command(folder: Path, name: str, stderr: str = "", stdout: str = "", code: int = 1) -> Path:
    """`folder/name`: a script that prints `stdout` and `stderr` (no single quotes in them) and exits `code`."""
    path = Path(folder) / name
    path.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nprintf '%s' '{stderr}' >&2\nexit {code}\n")
    path.chmod(0o755)
    return path
