"""Supervising a running job, the same way for `jaxlaunch run` and for Slurm batch jobs.

- `supervise.py`: the supervisor: starts mpirun or srun, enforces `timeout`, turns SIGTERM, SIGHUP
  and SIGINT into a clean stop, acts on the ranks' watchdog requests, restarts (`max_restarts`).
- `root_cause.py`: failure.json, the first failing rank and why, and the hang report.
- `processes.py`: a job's processes on this machine, found by the run directory in their environment.
- `__main__.py`: `python -m launcher.supervisor RUN_DIR -- LAUNCH...`, what batch scripts run.

The ranks' half (collective tracking, stack dumps, the watchdog thread) lives in
launcher/runtime/monitor.py; the two talk through files in the run directory.
"""

from .supervise import EXIT_TIMEOUT, Outcome, describe_outcome, result_text, supervise

__all__ = ["EXIT_TIMEOUT", "Outcome", "describe_outcome", "result_text", "supervise"]
