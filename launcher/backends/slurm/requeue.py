"""Requeue decisions and accounting for a Slurm job that was preempted or reached its time-limit
notice (the supervisor's attempt loop, supervise.py, asks; status.json keeps the counts).

The supervisor runs inside the batch job. After the ranks stopped at an agreed point (their
checkpoint is written), or after Slurm's preemption ended them, it requeues the job itself with
`scontrol requeue` (same job id; Slurm runs the batch script again with SLURM_RESTART_COUNT+1),
up to `slurm.max_requeues`. Preemptions and time limits are counted apart, as submitit does; both
count against the limit, so a job that can never finish cannot loop forever.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime

from ...errors import SchedulerError
from ...rundir import RunDirectory, atomic_write_json
from ...rank.checkpoints import Checkpoints
from . import scheduler
from ...spec import JobSpec
from ...states import EXIT_FAILED, Cause, JobState
from . import nodes
from ...supervisor import root_cause

JOB_ID_ENV = "SLURM_JOB_ID"
RESTART_COUNT_ENV = "SLURM_RESTART_COUNT"
# How near the time limit a notice to the batch shell must come to count as the time-limit
# warning (Slurm sends --signal up to 60 s early), rather than a preemption or a person.
TIME_LIMIT_SLACK_SECONDS = 60
CAUSES = (Cause.PREEMPTION, Cause.TIMEOUT)


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


def cancelled_by_slurm(record: dict) -> bool:
    """Slurm is ending this job because somebody cancelled it (scancel, or an admin), not for a
    preemption or its time limit. Read off `scontrol show job` while the job ends (Slurm 22.05,
    measured): a cancel shows JobState=COMPLETING (or CANCELLED) with Reason=None; the time limit
    COMPLETING with Reason=TimeLimit; a preemption RUNNING with PreemptTime set, then PENDING once
    Slurm has requeued it."""
    state = record.get("JobState", "").split("+")[0]
    ending = state in ("COMPLETING", "CANCELLED")  # Slurm's word
    return ending and record.get("Reason", "None") in ("None", "") and not preempted_by_slurm(record)


def seconds_left(record: dict, now: float | None = None) -> float | None:
    try:
        end = datetime.strptime(record["EndTime"], "%Y-%m-%dT%H:%M:%S").timestamp()
    except (KeyError, ValueError):
        return None
    return end - (now or time.time())


def classify(record: dict, sources: set[str], notice_seconds: int) -> str:
    """'preemption' or 'timeout' for a notice that came from `sources` (preemption.SOURCES names)."""
    if preempted_by_slurm(record) or "SIGTERM" in sources:
        return Cause.PREEMPTION
    left = seconds_left(record)
    if "supervisor" in sources and left is not None and left <= notice_seconds + TIME_LIMIT_SLACK_SECONDS:
        return Cause.TIMEOUT
    return Cause.PREEMPTION  # a person or a script sent the notice (scancel --signal=USR2)


def requeue(job_id: str) -> str | None:
    """`scontrol requeue`; None when it worked, else Slurm's error text."""
    try:
        scheduler.call_slurm(["scontrol", "requeue", job_id], timeout=30)
        return None
    except SchedulerError as exc:
        return str(exc)


def cancel_in_slurm(job_id: str) -> None:
    """After `jaxlaunch cancel` asked this supervisor alone to stop (its stacks are collected, its
    state recorded): scancel the job, so that Slurm records it CANCELLED too and frees its nodes.
    A plain scancel got there first when this fails."""
    try:
        scheduler.cancel(job_id)
    except SchedulerError:
        pass


def count_requeues_slurm_made(run: RunDirectory, spec: JobSpec, attempts: int, echo) -> dict | None:
    """At the start of a requeued batch job: count the requeues Slurm made without us (a
    preemption that killed the job before it could stop). Returns failure.json's document, with
    the job recorded FAILED, when slurm.max_requeues is spent; else None."""
    status = run.status()
    restarts = int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)
    requeues = status.requeues
    if restarts > requeues:
        extra = restarts - requeues
        run.update_status(requeues=restarts, preemptions=status.preemptions + extra)
        run.log_event("requeued_by_slurm", count=extra, restart_count=restarts)
        requeues = restarts
    if requeues > spec.slurm.max_requeues:
        failure = limit_failure(run, spec, requeues, Cause.PREEMPTION, attempts)
        run.update_status(state=JobState.FAILED, exit_code=EXIT_FAILED, ended=time.time(), reason=failure["summary"])
        return failure
    if restarts:
        echo(f"jaxlaunch: requeued job restarting (requeue {restarts} of at most {spec.slurm.max_requeues}); "
             f"the job resumes from its latest checkpoint")
    return None


def decide(run: RunDirectory, spec: JobSpec, job_id: str, sources: set[str], checkpointed: bool, echo
           ) -> tuple[str, dict | None, str | None]:
    """After a notice stopped the job (or Slurm's preemption ended it): (REQUEUED, None, cause) with
    the counts in status.json moved on, or (FAILED, failure, cause) once slurm.max_requeues
    requeues are spent."""
    cause = classify(job_record(job_id), sources, spec.slurm.checkpoint_notice)
    status = run.status()
    if status.requeues >= spec.slurm.max_requeues:
        failure = limit_failure(run, spec, status.requeues, cause, (status.attempts or 1) - 1)
        return JobState.FAILED.value, failure, cause
    counts = {Cause.PREEMPTION: status.preemptions, Cause.TIMEOUT: status.timeouts}
    counts[cause] += 1
    run.update_status(requeues=status.requeues + 1, preemptions=counts[Cause.PREEMPTION], timeouts=counts[Cause.TIMEOUT])
    how = "after stopping at an agreed step" if checkpointed else "after the job was ended without a stop"
    echo(f"jaxlaunch: {cause} notice ({', '.join(sorted(sources)) or 'Slurm'}); requeueing job {job_id} {how} "
         f"(requeue {status.requeues + 1} of at most {spec.slurm.max_requeues})")
    return JobState.REQUEUED.value, None, cause


def requeue_now(run: RunDirectory, job_id: str, cause: str | None, echo, exclude: list[str] = ()) -> None:
    """`scontrol requeue`, then the nodes to leave behind into the job's ExcNodeList: Slurm takes
    that update only from a pending job, which the requeue makes it at once. The requeue also
    sends this batch script SIGTERM (ignored until the update is in) and, KillWait later, SIGKILL:
    so everything else is done before, and the update is one scheduler call."""

    exclude = list(exclude)
    wanted = nodes.exclusion_list(job_record(job_id), exclude) if exclude else None
    run.log_event("requeue", job_id=job_id, cause=cause, **({"exclude": exclude} if exclude else {}))
    previous = None
    if exclude and threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        error = requeue(job_id)
        if error is not None:
            # Slurm may be requeueing it already (a preemption with PreemptMode=REQUEUE).
            echo(f"jaxlaunch: scontrol requeue {job_id} failed: {error}")
            run.log_event("requeue_failed", error=error)
        if wanted:
            problem = nodes.exclude(job_id, wanted)
            if problem is not None:
                echo(f"jaxlaunch: could not exclude {', '.join(exclude)} from job {job_id}: {problem}")
                run.log_event("exclude_failed", nodes=exclude, error=problem)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def limit_failure(run: RunDirectory, spec: JobSpec, requeues: int, cause: str, attempt: int) -> dict:
    """failure.json for a job whose requeues are spent (written, and returned)."""
    status = run.status()
    latest = Checkpoints(run.checkpoints).latest_step()
    where = (f"the latest checkpoint is step {latest} in {run.path}/checkpoints"
             if latest is not None else "no checkpoint was written")
    summary = (f"{cause} notice after {requeues} requeue(s) ({status.preemptions} preemption(s), "
               f"{status.timeouts} time limit(s)): slurm.max_requeues={spec.slurm.max_requeues} is spent; {where}")
    failure = root_cause.scheduler_failure(reason=Cause.REQUEUE_LIMIT, summary=summary, attempt=attempt,
                                           fix="raise slurm.max_requeues, or a longer slurm.time, and resubmit")
    atomic_write_json(run.failure_file, failure)
    run.log_event("requeue_limit", requeues=requeues, cause=cause)
    return failure
