"""Supervising a running job, the same way for `jaxlaunch run` and for Slurm batch jobs.

- `supervise.py`: the supervisor: starts mpirun or srun, enforces `timeout`, turns SIGTERM, SIGHUP
  and SIGINT into a clean stop, acts on the ranks' watchdog requests, restarts (`max_restarts`).
- `requeue.py`: a preempted Slurm job: classify the notice, count requeues, requeue or give up.
- `root_cause.py`: failure.json, the first failing rank and why, and the hang report.
- `report.py`: what people see: the ranks' output passed through, the end-of-job lines, the result.
- `processes.py`: a job's processes on this machine, found by the run directory in their environment.
- `__main__.py`: `python -m launcher.supervisor RUN_DIR -- LAUNCH...`, what batch scripts run.

The ranks' half (collective tracking, stack dumps, the watchdog thread) lives in
launcher/rank/monitor.py; the two talk through the control channel (launcher/control.py).
"""

from .report import describe_outcome, result_text
from .supervise import EXIT_TIMEOUT, Outcome, supervise

__all__ = ["EXIT_TIMEOUT", "Outcome", "describe_outcome", "result_text", "supervise"]
