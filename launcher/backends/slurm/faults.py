"""Faults `jaxlaunch drill --target slurm` injects into a running job, as Slurm itself would deliver
them, through the one wrapper for Slurm's commands (scheduler.call_slurm):
- `preempt`: Slurm's own preemption notice to the batch step (`scancel --batch --signal=USR2`);
- `kill`, `hang`: SIGKILL or SIGSTOP to one rank's process, on its node, from a step of the job
  (`srun --jobid --overlap`: one task per node, and the node where the rank runs signals it);
- `node`: the rank's node set DOWN (`scontrol update state=down`, Slurm operator rights), never the
  batch node (the supervisor runs there); `resume_node` gives it back after the trial.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ...errors import SchedulerError
from ..faults import FaultNotInjected
from ...rundir import RunDirectory
from . import scheduler


def inject(fault: str, job_id: str, run_dir: Path, rank: int, processes_per_node: int) -> str | None:
    """Inject `fault` into job `job_id`; the node set DOWN (to resume after the trial), else None.
    FaultNotInjected says why it could not be."""
    if not job_id:
        raise FaultNotInjected("the job's Slurm id is not in its status.json")
    if fault == "preempt":  # what Slurm's --signal=B:USR2@... warning does
        try:
            scheduler.call_slurm(["scancel", "--batch", "--signal=USR2", job_id])
        except SchedulerError as exc:
            raise FaultNotInjected(f"scancel failed: {exc.stderr.strip()}") from None
        return None
    if fault == "node":
        node = _node_of_rank(job_id, run_dir, rank, processes_per_node)
        try:
            scheduler.call_slurm(["scontrol", "update", f"nodename={node}", "state=down", "reason=jaxlaunch drill"])
        except SchedulerError as exc:
            raise FaultNotInjected(f"cannot set {node} DOWN (needs Slurm operator rights): {exc.stderr.strip()}") \
                from None
        return node
    import signal

    signum = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
    try:  # the step may end non-zero (the job's own srun reacting): what counts is who signalled
        said, errors = scheduler.call_slurm(
            ["srun", f"--jobid={job_id}", "--overlap", "--mpi=none", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
             sys.executable, "-m", "launcher.backends.faults", "signal", str(run_dir), str(rank), str(int(signum))],
            timeout=120), ""
    except SchedulerError as exc:
        said, errors = exc.stdout or "", exc.stderr or ""
    if "signalled" not in said:
        raise FaultNotInjected(f"rank {rank}'s process was not found on the job's nodes: {errors.strip()[-300:]}")
    return None


def resume_node(node: str) -> None:
    """Give a node the drill set DOWN back to the cluster (best effort: the trial is over)."""
    try:
        scheduler.call_slurm(["scontrol", "update", f"nodename={node}", "state=resume"])
    except SchedulerError:
        pass


def _node_of_rank(job_id: str, run_dir: Path, rank: int, processes_per_node: int) -> str:
    """The node `rank` runs on (the attempt's node list, block by block), or another rank's when
    that is the batch node."""
    from .requeue import job_record

    record = job_record(job_id)
    launches = [e["argv"] for e in RunDirectory(run_dir).read_events() if e["event"] == "launch"]
    listed = next((a.partition("=")[2] for a in (launches[-1] if launches else []) if a.startswith("--nodelist=")),
                  record.get("NodeList", ""))
    names = scheduler.call_slurm(["scontrol", "show", "hostnames", listed]).split() if listed else []
    if not names:
        raise FaultNotInjected(f"cannot tell the job's nodes (NodeList {listed!r})")
    order = [names[min(rank // processes_per_node, len(names) - 1)], *names]
    node = next((n for n in order if n != record.get("BatchHost")), None)
    if node is None:
        raise FaultNotInjected("every node of the job is its batch node: a node fault would end it (nothing to drill)")
    return node
