"""Requeue decisions for a Slurm job that was preempted or reached its time-limit notice.

The supervisor runs inside the batch job. After the ranks stopped at an agreed point (their
checkpoint is written), or after Slurm's preemption ended them, it requeues the job itself with
`scontrol requeue` (same job id; Slurm runs the batch script again with SLURM_RESTART_COUNT+1),
up to `slurm.max_requeues`. Preemptions and time limits are counted apart, as submitit does; both
count against the limit, so a job that can never finish cannot loop forever.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

from ..errors import SchedulerError
from ..slurm import scheduler

JOB_ID_ENV = "SLURM_JOB_ID"
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
# How near the time limit a notice to the batch shell must come to count as the time-limit
# warning (Slurm sends --signal up to 60 s early), rather than a preemption or a person.
TIME_LIMIT_SLACK_SECONDS = 60
CAUSES = ("preemption", "timeout")


def slurm_job_id(env=os.environ) -> str | None:
    """The id to requeue: an array task's own id when it is one."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get(JOB_ID_ENV)


def job_record(job_id: str) -> dict:
    try:
        return scheduler.parse_scontrol_record(
            scheduler.call_slurm(["scontrol", "show", "job", "--oneliner", job_id], timeout=20))
    except SchedulerError:
        return {}


def preempted_by_slurm(record: dict) -> bool:
    """Slurm chose this job for preemption (PreemptTime is set from then on)."""
    return record.get("PreemptTime", "None") not in ("", "None", "Unknown")


def seconds_left(record: dict, now: float | None = None) -> float | None:
    try:
        end = datetime.strptime(record["EndTime"], "%Y-%m-%dT%H:%M:%S").timestamp()
    except (KeyError, ValueError):
        return None
    return end - (now or time.time())


def classify(record: dict, sources: set[str], notice_seconds: int) -> str:
    """'preemption' or 'timeout' for a notice that came from `sources` (preemption.SOURCES names)."""
    if preempted_by_slurm(record) or "SIGTERM" in sources:
        return "preemption"
    left = seconds_left(record)
    if "supervisor" in sources and left is not None and left <= notice_seconds + TIME_LIMIT_SLACK_SECONDS:
        return "timeout"
    return "preemption"  # a person or a script sent the notice (scancel --signal=USR2)


def requeue(job_id: str) -> str | None:
    """`scontrol requeue`; None when it worked, else Slurm's error text."""
    try:
        scheduler.call_slurm(["scontrol", "requeue", job_id], timeout=30)
        return None
    except SchedulerError as exc:
        return str(exc)
