"""Talking to Slurm: one wrapper runs every command; parsers and the state table live here too.

Every call goes through `call_slurm`: an argv list (never a shell), a timeout, and on failure a
SchedulerError carrying the command, exit code and stderr. The environment is passed through, so
SLURM_CONF and the usual SLURM_* variables are honoured.

When Slurm cannot be asked at all from here (no Slurm commands, no configuration, no controller
answering) the error is a SlurmUnreachable that says why in one line and gives the fix, in the
words `jaxlaunch doctor` uses too (they live here, once), so every command that needs Slurm says
the same thing.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...errors import SchedulerError
from ...states import JobState
from ..records import SchedulerUnreachable

COMMAND_TIMEOUT = 60

# What to do when Slurm cannot be asked: shown by every command that needs Slurm, and by doctor.
NO_SLURM_NEEDED = "jaxlaunch run needs no Slurm"
ON_LOGIN_NODE = "for submit, status, logs and cancel: run on the cluster's login node, or load Slurm there"
REACH_CONTROLLER = "set SLURM_CONF to the cluster's slurm.conf, or run on its login node"
FIX_NO_COMMANDS = f"{NO_SLURM_NEEDED}; {ON_LOGIN_NODE}"
FIX_CONF_NOT_A_FILE = f"point SLURM_CONF at the cluster's slurm.conf, or unset it; {NO_SLURM_NEEDED}"
FIX_NO_CONTROLLER = f"{NO_SLURM_NEEDED}; submit needs a reachable slurmctld: {REACH_CONTROLLER}"  # doctor's
FIX_UNREACHABLE = f"{REACH_CONTROLLER}; {NO_SLURM_NEEDED}"  # a command's that needed Slurm
# What Slurm's commands print (last line) when they have no configuration, or no controller answers.
NOT_CONFIGURED = ("Could not establish a configuration source", "Unable to process configuration file")
NO_ANSWER = ("Unable to contact slurm controller",)


def where_configured(env=None) -> str:
    """Where Slurm's commands look for their configuration ('SLURM_CONF=...', or what they do without it)."""
    conf = (os.environ if env is None else env).get("SLURM_CONF")
    return f"SLURM_CONF={conf}" if conf else "SLURM_CONF is unset, so /etc/slurm/slurm.conf or DNS SRV"


class SlurmUnreachable(SchedulerUnreachable):
    """Slurm cannot be asked from here: its commands are missing, it has no configuration, or its
    controller does not answer. `why` is one line, `fix` what to do. Exit code 2 when this machine
    is not set up for Slurm (the fix is the user's); 1 when a configured controller does not answer."""

    def __init__(self, argv, returncode, stderr, why: str, fix: str, exit_code: int = 2):
        super().__init__(argv, returncode, "", stderr, why, fix)
        self.exit_code = exit_code
        self.args = (f"Slurm could not be asked: {why}.\n  fix: {fix}.",)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _unreachable(argv: list[str], returncode: int, stderr: str) -> SlurmUnreachable | None:
    """The SlurmUnreachable that a failed command's stderr shows, or None (an ordinary refusal)."""
    last = _last_line(stderr)
    if not any(words in last for words in NOT_CONFIGURED + NO_ANSWER):
        return None
    name = Path(argv[0]).name
    said = last if last.startswith(f"{name}:") else f"{name}: {last}"
    configured = not any(words in last for words in NOT_CONFIGURED)
    return SlurmUnreachable(argv, returncode, stderr, f"{said} ({where_configured()})", FIX_UNREACHABLE,
                            exit_code=1 if configured else 2)


# Slurm state -> (our state, finished?). One table, used by status, --wait and logs -f.
STATES = {
    "PENDING": (JobState.PENDING, False), "CONFIGURING": (JobState.PENDING, False), "REQUEUED": (JobState.PENDING, False),
    "REQUEUE_HOLD": (JobState.PENDING, False), "REQUEUE_FED": (JobState.PENDING, False), "RESV_DEL_HOLD": (JobState.PENDING, False),
    "RUNNING": (JobState.RUNNING, False), "COMPLETING": (JobState.RUNNING, False), "SUSPENDED": (JobState.SUSPENDED, False),
    "STOPPED": (JobState.SUSPENDED, False), "SIGNALING": (JobState.RUNNING, False), "STAGE_OUT": (JobState.RUNNING, False),
    "RESIZING": (JobState.RUNNING, False),
    "COMPLETED": (JobState.COMPLETED, True),
    "FAILED": (JobState.FAILED, True), "NODE_FAIL": (JobState.FAILED, True), "BOOT_FAIL": (JobState.FAILED, True),
    "OUT_OF_MEMORY": (JobState.OUT_OF_MEMORY, True), "SPECIAL_EXIT": (JobState.FAILED, True),
    "CANCELLED": (JobState.CANCELLED, True), "REVOKED": (JobState.CANCELLED, True), "DEADLINE": (JobState.TIMEOUT, True),
    "TIMEOUT": (JobState.TIMEOUT, True), "PREEMPTED": (JobState.PREEMPTED, True),
}


def translate_state(slurm_state: str) -> tuple[str, bool]:
    """(our state, finished) for a Slurm state such as 'CANCELLED by 0' or 'RUNNING+'."""
    word = re.split(r"[\s+]", slurm_state.strip(), maxsplit=1)[0].upper()
    return STATES.get(word, (word or JobState.UNKNOWN.value, False))  # an unknown word is shown as Slurm said it


def call_slurm(argv: list[str], timeout: float = COMMAND_TIMEOUT, hint: str = "") -> str:
    """Run one scheduler command; its stdout, or SchedulerError with command, exit code, stderr
    (SlurmUnreachable, with the fix, when Slurm cannot be asked from here at all)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # Slurm's commands would retry for 60 s before saying so
        raise SlurmUnreachable(argv, None, "", f"SLURM_CONF={conf} is not a file", FIX_CONF_NOT_A_FILE)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmUnreachable(argv, 127, f"{argv[0]}: command not found", f"{argv[0]} is not on PATH",
                               FIX_NO_COMMANDS) from None
    except subprocess.TimeoutExpired as exc:
        raise SchedulerError(argv, -1, exc.stdout or "", f"timed out after {timeout} s", hint=hint) from None
    if done.returncode != 0:
        raise _unreachable(argv, done.returncode, done.stderr) or SchedulerError(
            argv, done.returncode, done.stdout, done.stderr, hint=hint)
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
class SlurmRecord:
    """What squeue, scontrol or sacct said of one job (SlurmJob.info makes the seam's JobInfo from it)."""

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

    @property
    def pending_reason(self) -> str:
        """squeue's reason while the job waits, '' otherwise (Slurm says 'None' for none)."""
        return self.reason if self.state == JobState.PENDING and self.reason != "None" else ""

    @property
    def limit(self) -> str:
        """The time limit, '' for none."""
        return "" if self.time_limit in ("UNLIMITED", "INVALID", "NOT_SET") else self.time_limit

    # The words of `jaxlaunch status`'s cells are launcher/cli/job_views.py's; these two say the
    # same for tests of this record alone (tests/unit/test_scheduler_units.py).
    def describe_state(self) -> str:
        return f"{self.state} ({self.pending_reason})" if self.pending_reason else self.state

    def describe_elapsed(self) -> str:
        return f"{self.elapsed}/{self.limit}" if self.limit else self.elapsed


def submit(script_path: str) -> str:
    """sbatch the script; returns the job id."""
    return parse_job_id(call_slurm(["sbatch", "--parsable", str(script_path)]))


def cancel(job_id: str) -> None:
    call_slurm(["scancel", str(job_id)])


def _squeue_infos(job_ids: list[str]) -> dict[str, SlurmRecord]:
    """Every job (or array task) in `job_ids` that squeue still lists, from ONE squeue call. An
    array's own id stands for its tasks: running while any task runs or waits."""
    try:
        # -r: a pending array's tasks one per line (else squeue folds them into 123_[1-5])
        out = call_slurm(["squeue", "-r", "--noheader", "--states=all", "--jobs", ",".join(job_ids),
                          "--format=%i|%T|%M|%D|%r|%l"])
    except SchedulerError as exc:
        if "Invalid job id" in exc.stderr:  # older Slurm: squeue knows none of them
            return {}
        raise
    rows = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 4:
            continue
        fields += [""] * (6 - len(fields))  # reason and time limit, when squeue gave them
        rows[fields[0]] = fields

    def info(job_id, fields, source):
        state, finished = translate_state(fields[1])
        return SlurmRecord(job_id, fields[1], state, finished, fields[2], fields[3], source,
                       reason=fields[4], time_limit=fields[5])

    found = {}
    for job_id in job_ids:
        if job_id in rows:
            found[job_id] = info(job_id, rows[job_id], "squeue")
            continue
        tasks = [fields for task, fields in rows.items() if task.startswith(f"{job_id}_")]
        if tasks:
            live = [t for t in tasks if not translate_state(t[1])[1]]
            found[job_id] = info(job_id, (live or tasks)[0], "squeue (array)")
    return found


def parse_scontrol_record(text: str) -> dict[str, str]:
    """`scontrol show job -o` output as a dict (values may contain spaces only in the last keys)."""
    fields = {}
    for match in re.finditer(r"(\w[\w/:]*)=(.*?)(?=\s+\w[\w/:]*=|$)", text.strip()):
        fields[match.group(1)] = match.group(2)
    return fields


def _scontrol_infos(job_ids: list[str]) -> dict[str, SlurmRecord]:
    """Jobs squeue no longer lists but the controller still holds, from ONE `scontrol show job`
    (of the one job, or of every job when several are asked for). An array task is found by its
    own JobId or as ArrayJobId_ArrayTaskId."""
    argv = ["scontrol", "show", "job", "--oneliner", *(job_ids if len(job_ids) == 1 else [])]
    try:
        out = call_slurm(argv)
    except SchedulerError as exc:
        if "Invalid job id" in exc.stderr or "not found" in exc.stderr:  # the latter: a purged array task
            return {}
        raise
    wanted, found = set(job_ids), {}
    for line in out.splitlines():
        record = parse_scontrol_record(line)
        for name in (record.get("JobId"), f"{record.get('ArrayJobId')}_{record.get('ArrayTaskId')}"):
            if name in wanted and name not in found:
                state, finished = translate_state(record.get("JobState", ""))
                found[name] = SlurmRecord(name, record.get("JobState", ""), state, finished, record.get("RunTime", ""),
                                      record.get("NumNodes", ""), "scontrol", record.get("ExitCode", ""))
    return found


def _sacct_infos(job_ids: list[str]) -> dict[str, SlurmRecord]:
    """Jobs the controller forgot, from ONE sacct call (nothing without an accounting database)."""
    try:
        out = call_slurm(["sacct", "--noheader", "--parsable2", "--jobs", ",".join(job_ids),
                          "--format=JobID,State,Elapsed,NNodes,ExitCode"])
    except SchedulerError:
        return {}  # no accounting database (slurmdbd) on this cluster
    wanted, found = set(job_ids), {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 5 and fields[0] in wanted:
            state, finished = translate_state(fields[1])
            found[fields[0]] = SlurmRecord(fields[0], fields[1], state, finished, fields[2], fields[3], "sacct", fields[4])
    return found


def query_jobs(job_ids) -> dict[str, SlurmRecord]:
    """The state of every job in `job_ids` in at most three scheduler calls, however many ids:
    squeue for those it lists, then scontrol (recently finished), then sacct (if Slurm keeps a
    database). Ids no command knows are absent from the answer."""
    job_ids = list(dict.fromkeys(str(j) for j in job_ids))
    found: dict[str, SlurmRecord] = {}
    for source in (_squeue_infos, _scontrol_infos, _sacct_infos):
        missing = [j for j in job_ids if j not in found]
        if not missing:
            break
        found.update(source(missing))
    return found


def query_job(job_id: str) -> SlurmRecord | None:
    """One job's state (see query_jobs)."""
    return query_jobs([job_id]).get(str(job_id))
