"""What a backend answers, as records: the seam speaks data and the CLI renders it
(launcher/cli/job_views.py), as torchx's schedulers return `DescribeAppResponse` and its
`cmd_status.py` prints them. A new backend fills these in; it writes none of the CLI's prose.

  JobInfo              one job as `jaxlaunch status` shows it (Backend.job_infos, Job.info)
  Requeues, SpareSwap  how a job survived its nodes and its preemptions (JobInfo's parts)
  Fit                  whether a spec can run on a backend (Backend.check_fit), for `explain` and `submit`

The errors below carry the facts a message needs. Each says itself from its fields, here and once
for every backend, because the Python API raises the same ones as the CLI shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SchedulerError, UnknownJobError, UsageError
from ..states import JobState


@dataclass(frozen=True)
class SpareSwap:
    """One swap of status.json's spare_swaps: `nodes` left for `spares`, and why (a Cause word)."""

    nodes: tuple[str, ...]
    spares: tuple[str, ...]
    cause: str

    @classmethod
    def from_status(cls, swap: dict) -> "SpareSwap":
        return cls(tuple(swap.get("nodes", [])), tuple(swap.get("spares", [])), swap.get("cause") or "")


@dataclass(frozen=True)
class Requeues:
    """How often a job requeued itself, and why; `bad_nodes`: requeues without a bad node."""

    total: int = 0
    preemptions: int = 0
    timeouts: int = 0
    hangs: int = 0
    bad_nodes: int = 0
    excluded_nodes: tuple[str, ...] = ()

    @classmethod
    def from_status(cls, status) -> "Requeues":
        return cls(status.requeues, status.preemptions, status.timeouts, status.hang_requeues,
                   status.node_failures, tuple(status.excluded_nodes or ()))


def history_fields(status) -> dict:
    """JobInfo's fields that status.json (a StatusRecord) holds: requeues and spare swaps."""
    return {"requeues": Requeues.from_status(status),
            "spare_swaps": tuple(SpareSwap.from_status(swap) for swap in status.spare_swaps or ())}


NO_RESULT = object()  # JobInfo.result of a job without a result file


@dataclass(frozen=True)
class JobInfo:
    """One job as its backend knows it now. `state` is the job's (Job.state); `reason` why the
    scheduler keeps it waiting ('Resources'), '' when it does not wait or did not say.
    `scheduler_knows` is False for a job its scheduler has forgotten: `state` is then the run
    directory's last word. `elapsed`, `time_limit` (''/None: no limit) and `nodes` are the
    scheduler's own words; `seconds` how long it ran by its status.json (a run of this machine);
    `result` what rank 0 returned (NO_RESULT: nothing) and `failure` the root cause's summary."""

    job_id: str
    backend: str
    state: JobState
    run_dir: Path | None = None
    reason: str = ""
    scheduler_knows: bool = True
    elapsed: str = ""
    time_limit: str = ""
    nodes: str = ""
    seconds: float | None = None
    result: object = NO_RESULT
    failure: str = ""
    requeues: Requeues = field(default_factory=Requeues)
    spare_swaps: tuple[SpareSwap, ...] = ()

    @property
    def unknown(self) -> bool:
        """Neither the scheduler nor jaxlaunch's records know the id (a wrong id): no row of its own."""
        return not self.scheduler_knows and self.run_dir is None


@dataclass(frozen=True)
class Fit:
    """Backend.check_fit's answer: `problems` stop the spec from ever starting there (each ends with
    its fix); `warnings` what could not be checked; `checked_against` what the request was held
    against ('the cluster'), '' when the backend gives no verdict of its own."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked_against: str = ""


def _plural(items) -> str:
    return "s" if len(items) > 1 else ""


class UnknownJobsError(UnknownJobError):
    """Ids a backend claims that neither it nor jaxlaunch's records know. `scheduler` ('Slurm'),
    `index` (jaxlaunch's record of the jobs it submitted) and `list_command` ('squeue --me') are
    given by a backend with a scheduler of its own."""

    def __init__(self, ids, backend: str, scheduler: str = "", index: Path | None = None, list_command: str = ""):
        self.ids, self.backend, self.scheduler = list(ids), backend, scheduler
        self.index, self.list_command = index, list_command
        super().__init__(str(self))

    def __str__(self) -> str:
        jobs = f"no job{_plural(self.ids)} {', '.join(self.ids)}"
        if not self.scheduler:
            return f"{jobs} known to the {self.backend} backend"
        where = f" (index: {self.index})" if self.index else ""
        check = f"`{self.list_command}` or " if self.list_command else ""
        return (f"{jobs} known to {self.scheduler} or to jaxlaunch{where}.\n"
                f"  fix: check the id{_plural(self.ids)} with {check}`jaxlaunch status`.")


class ForgottenJobError(UnknownJobError):
    """A job its backend no longer knows before its end was seen (Slurm purged it), so waiting for it
    would never end."""

    def __init__(self, job_id: str, backend: str, scheduler: str = "", run_dir: Path | None = None):
        self.job_id, self.backend, self.scheduler, self.run_dir = job_id, backend, scheduler, run_dir
        super().__init__(str(self))

    def __str__(self) -> str:
        if not self.scheduler:
            return f"job {self.job_id}: its {self.backend} backend does not know it"
        where = f" (run directory: {self.run_dir})" if self.run_dir is not None else ""
        return (f"job {self.job_id} is not known to {self.scheduler}{where}: it ended and was purged before it was "
                f"seen to finish, or the id is wrong.\n  fix: see `jaxlaunch logs {self.job_id}` and the run "
                f"directory's status.json.")


class NoRunDirectory(UsageError):
    """A job without a run directory jaxlaunch knows, so no records to read. `index`: where jaxlaunch
    records the jobs it submits to this backend (a job not there was submitted some other way)."""

    def __init__(self, job_id: str, backend: str, index: Path | None = None):
        self.job_id, self.backend, self.index = job_id, backend, index
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.index is None:
            return (f"job {self.job_id} has no run directory that jaxlaunch knows.\n"
                    f"  fix: name its run directory (RUN_DIR) instead.")
        return (f"job {self.job_id} has no run directory that jaxlaunch knows: it was not submitted by jaxlaunch "
                f"from this account (index: {self.index}).\n  fix: name its run directory (RUN_DIR) instead "
                f"of the id, if it has one.")


class NoLogYet(UsageError):
    """The one file `Job.logs(rank)` reads (`path`) does not exist yet."""

    def __init__(self, job_id: str, rank: int | None, path: Path):
        self.job_id, self.rank, self.path = job_id, rank, path
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"no log yet at {self.path}" + ("" if self.rank is None else f" (does rank {self.rank} exist?)")


class SchedulerUnreachable(SchedulerError):
    """The scheduler cannot be asked from here (no commands, no configuration, no controller
    answering): the command as it failed, `why` in one line, `fix` what to do. A backend raises
    its own subclass (Slurm's SlurmUnreachable); `jaxlaunch status` puts `why` and `fix` in the
    one line that stands for that backend's part."""

    def __init__(self, argv, returncode, stdout, stderr, why: str, fix: str = ""):
        super().__init__(argv, returncode, stdout, stderr)
        self.why, self.fix = why, fix


__all__ = ["JobInfo", "Requeues", "SpareSwap", "history_fields", "NO_RESULT", "Fit", "UnknownJobsError", "ForgottenJobError",
           "NoRunDirectory", "NoLogYet", "SchedulerUnreachable"]
