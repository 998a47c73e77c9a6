"""Supervising a running job, the same way for `jaxlaunch run` and for Slurm batch jobs (whose
script runs launcher/backends/slurm/batch.py).

- `supervise.py`: the supervisor's policy over attempts: restarts (`max_restarts`), spare swaps and
  requeues as its Allocation decides, the governor's stop (`governor.py`: a failure that repeats).
  What it needs from a scheduler it asks its Allocation.
- `attempt.py`: one attempt: starts mpirun or srun, enforces `timeout`, acts on the ranks' watchdog
  requests and the hang watchdog (`watchdog.py`, with the roll-call of `rollcall.py`), stops the job
  cleanly, writes the attempt's failure.json.
- `notices.py`: SIGTERM, SIGHUP and SIGINT as a clean stop; SIGUSR2 as a preemption notice to every rank.
- `streams.py`: the launcher's two output streams passed on live.
- `allocation.py`: that interface (the in-job side of a backend); each backend implements it.
- `channel.py`: its end of the control channel (the server the ranks connect to).
- `root_cause.py`: failure.json, the first failing rank and why, and the hang report.
- `report.py`: what people see: the ranks' output passed through, the end-of-job lines, the result.
- `processes.py`: a job's processes on this machine, found by the run directory in their environment.
- `__main__.py`: `python -m launcher.supervisor`, the line of batch scripts rendered before the Slurm
  backend had its own program (launcher/backends/slurm/batch.py), which it runs.

The ranks' half (collective tracking, stack dumps, the watchdog thread) lives in
launcher/rank/monitor.py; the two talk through the control channel: the protocol in
launcher/channel.py, the supervisor's end in `channel.py` here, the rank's in launcher/rank/channel.py.
"""

from .report import describe_outcome, result_text
from .supervise import EXIT_TIMEOUT, Outcome, supervise

__all__ = ["EXIT_TIMEOUT", "Outcome", "describe_outcome", "result_text", "supervise"]
