"""Exceptions raised by the library. The CLI turns them into messages and exit codes."""


class JaxlaunchError(Exception):
    """Base class: an error whose message is meant for the user, shown without a traceback."""

    exit_code = 1


class SpecError(JaxlaunchError):
    """The job spec or a --set override is invalid. The message names file, line, key and fix."""

    exit_code = 2


class UsageError(JaxlaunchError):
    """The command line is wrong in a way click cannot see (e.g. a run directory that exists)."""

    exit_code = 2


class SchedulerError(JaxlaunchError):
    """A scheduler command (sbatch, squeue, ...) failed; carries the command, exit code and stderr."""

    def __init__(self, argv, returncode, stdout, stderr, hint=""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        command = " ".join(self.argv)
        message = f"command failed (exit code {returncode}): {command}"
        if stderr.strip():
            message += "\n" + stderr.strip()
        elif stdout.strip():
            message += "\n" + stdout.strip()
        if hint:
            message += "\n" + hint
        super().__init__(message)


class UnknownJobError(UsageError):
    """No scheduler and no index knows the job id (a wrong id, or a job Slurm has forgotten)."""


class JobStateError(JaxlaunchError):
    """The job is not in a state for what was asked (cancel a finished run, the result of a job
    that is still running)."""


class JobFailedError(JobStateError):
    """`result()` of a job that did not complete: its final state and its failure.json (the root
    cause: failing rank, summary, traceback), when the supervisor wrote one."""

    def __init__(self, message: str, state: str, failure: dict | None = None):
        super().__init__(message)
        self.state = state
        self.failure = failure
        first = (failure or {}).get("first_failure") or {}
        self.rank = first.get("rank")
        self.remote_traceback = first.get("traceback")


class NoResultError(JobStateError):
    """`result()` of a job that COMPLETED without a result: a script or module entrypoint returns
    none (it may set one with `launcher.context().set_result(value)`)."""
