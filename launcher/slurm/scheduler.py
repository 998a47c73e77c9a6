"""Talking to Slurm: one wrapper runs every command; parsers and the state table live here too.

Every call goes through `call_slurm`: an argv list (never a shell), a timeout, and on failure a
SchedulerError carrying the command, exit code and stderr. The environment is passed through, so
SLURM_CONF and the usual SLURM_* variables are honoured.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from ..errors import SchedulerError

COMMAND_TIMEOUT = 60

# Slurm state -> (our state, finished?). One table, used by status, --wait and logs -f.
STATES = {
    "PENDING": ("PENDING", False), "CONFIGURING": ("PENDING", False), "REQUEUED": ("PENDING", False),
    "REQUEUE_HOLD": ("PENDING", False), "REQUEUE_FED": ("PENDING", False), "RESV_DEL_HOLD": ("PENDING", False),
    "RUNNING": ("RUNNING", False), "COMPLETING": ("RUNNING", False), "SUSPENDED": ("SUSPENDED", False),
    "STOPPED": ("SUSPENDED", False), "SIGNALING": ("RUNNING", False), "STAGE_OUT": ("RUNNING", False),
    "RESIZING": ("RUNNING", False),
    "COMPLETED": ("COMPLETED", True),
    "FAILED": ("FAILED", True), "NODE_FAIL": ("FAILED", True), "BOOT_FAIL": ("FAILED", True),
    "OUT_OF_MEMORY": ("OUT_OF_MEMORY", True), "SPECIAL_EXIT": ("FAILED", True),
    "CANCELLED": ("CANCELLED", True), "REVOKED": ("CANCELLED", True), "DEADLINE": ("TIMEOUT", True),
    "TIMEOUT": ("TIMEOUT", True), "PREEMPTED": ("PREEMPTED", True),
}


def translate_state(slurm_state: str) -> tuple[str, bool]:
    """(our state, finished) for a Slurm state such as 'CANCELLED by 0' or 'RUNNING+'."""
    word = re.split(r"[\s+]", slurm_state.strip(), maxsplit=1)[0].upper()
    return STATES.get(word, (word or "UNKNOWN", False))


def call_slurm(argv: list[str], timeout: float = COMMAND_TIMEOUT, hint: str = "") -> str:
    """Run one scheduler command; its stdout, or SchedulerError with command, exit code, stderr."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SchedulerError(argv, 127, "", f"{argv[0]}: command not found",
                             hint="is Slurm installed here? jaxlaunch submit runs on a cluster login node") from None
    except subprocess.TimeoutExpired as exc:
        raise SchedulerError(argv, -1, exc.stdout or "", f"timed out after {timeout} s", hint=hint) from None
    if done.returncode != 0:
        raise SchedulerError(argv, done.returncode, done.stdout, done.stderr, hint=hint)
    return done.stdout


JOB_ID = re.compile(r"^(?P<job_id>\d+)(;(?P<cluster>\S+))?\s*$")


def parse_job_id(sbatch_output: str) -> str:
    """The id from `sbatch --parsable` output ('123' or '123;cluster')."""
    for line in reversed(sbatch_output.strip().splitlines()):
        match = JOB_ID.match(line.strip())
        if match:
            return match.group("job_id")
    raise SchedulerError(["sbatch", "--parsable"], 0, sbatch_output, "",
                         hint=f"could not find a job id in sbatch's output: {sbatch_output!r}")


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    slurm_state: str
    state: str
    finished: bool
    elapsed: str
    nodes: str
    source: str  # which command answered: squeue, scontrol or sacct
    exit_code: str = ""
    reason: str = ""       # why it is pending (squeue's %r: Resources, Priority, PartitionTimeLimit...)
    time_limit: str = ""   # Slurm's limit for it (%l), to read `elapsed` against

    def describe_state(self) -> str:
        """'PENDING (Resources)': the state, with squeue's reason while the job waits."""
        if self.state == "PENDING" and self.reason and self.reason != "None":
            return f"{self.state} ({self.reason})"
        return self.state

    def describe_elapsed(self) -> str:
        """'0:42/1:00:00': elapsed against the time limit, when Slurm gave one (one word: tables
        and scripts split rows on whitespace)."""
        if self.time_limit and self.time_limit not in ("UNLIMITED", "INVALID", "NOT_SET"):
            return f"{self.elapsed}/{self.time_limit}"
        return self.elapsed


def submit(script_path: str) -> str:
    """sbatch the script; returns the job id."""
    return parse_job_id(call_slurm(["sbatch", "--parsable", str(script_path)]))


def cancel(job_id: str) -> None:
    call_slurm(["scancel", str(job_id)])


def _from_squeue(job_id: str) -> JobInfo | None:
    try:
        # -r: a pending array's tasks one per line (else squeue folds them into 123_[1-5])
        out = call_slurm(["squeue", "-r", "--noheader", "--states=all", "--jobs", job_id,
                          "--format=%i|%T|%M|%D|%r|%l"])
    except SchedulerError as exc:
        if "Invalid job id" in exc.stderr:  # squeue no longer knows it
            return None
        raise
    tasks = []
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 4:
            continue
        fields += [""] * (6 - len(fields))  # reason and time limit, when squeue gave them
        if fields[0] == job_id:
            state, finished = translate_state(fields[1])
            return JobInfo(job_id, fields[1], state, finished, fields[2], fields[3], "squeue",
                           reason=fields[4], time_limit=fields[5])
        if fields[0].startswith(f"{job_id}_"):
            tasks.append(fields)
    if tasks:  # a job array's id: running while any task runs or waits
        live = [t for t in tasks if not translate_state(t[1])[1]]
        first = (live or tasks)[0]
        state, finished = translate_state(first[1])
        return JobInfo(job_id, first[1], state, finished, first[2], first[3], "squeue (array)",
                       reason=first[4], time_limit=first[5])
    return None


def parse_scontrol_record(text: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict (values may contain spaces only in the last keys)."""
    fields = {}
    for match in re.finditer(r"(\w[\w/:]*)=(.*?)(?=\s+\w[\w/:]*=|$)", text.strip()):
        fields[match.group(1)] = match.group(2)
    return fields


def _from_scontrol(job_id: str) -> JobInfo | None:
    try:
        out = call_slurm(["scontrol", "show", "job", "--oneliner", job_id])
    except SchedulerError as exc:
        if "Invalid job id" in exc.stderr or "not found" in exc.stderr:  # the latter: a purged array task
            return None
        raise
    record = parse_scontrol_record(out)
    array_task = f"{record.get('ArrayJobId')}_{record.get('ArrayTaskId')}"  # an array task's own JobId differs
    if job_id not in (record.get("JobId"), array_task):
        return None
    state, finished = translate_state(record.get("JobState", ""))
    return JobInfo(job_id, record.get("JobState", ""), state, finished, record.get("RunTime", ""),
                   record.get("NumNodes", ""), "scontrol", record.get("ExitCode", ""))


def _from_sacct(job_id: str) -> JobInfo | None:
    try:
        out = call_slurm(["sacct", "--noheader", "--parsable2", "--jobs", job_id,
                          "--format=JobID,State,Elapsed,NNodes,ExitCode"])
    except SchedulerError:
        return None  # no accounting database (slurmdbd) on this cluster
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 5 and fields[0] == job_id:
            state, finished = translate_state(fields[1])
            return JobInfo(job_id, fields[1], state, finished, fields[2], fields[3], "sacct", fields[4])
    return None


def query_job(job_id: str) -> JobInfo | None:
    """The job's state from squeue, else scontrol (recently finished), else sacct (if it has a database)."""
    job_id = str(job_id)
    return _from_squeue(job_id) or _from_scontrol(job_id) or _from_sacct(job_id)
