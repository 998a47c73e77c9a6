"""The Slurm backend: everything jaxlaunch knows about Slurm lives in this package. Code outside
it uses only what this file exports (the `Backend` seam, launcher/backends/base.py);
tests/unit/test_layout.py checks that nothing imports the modules below from outside.

  backend.py       SlurmBackend: sbatch a rendered script or sweep, find and list jobs, hand out handles
  job.py           SlurmJob, the handle: its state, logs and cancel, its requeue and spare-node lines
  watcher.py       SlurmWatcher, the one per process that batches every handle's squeue calls
  scheduler.py     the one wrapper that runs every Slurm command, its parsers, the state table, and
                   the batched query (`query_jobs`: at most three commands for any number of jobs)
  render.py        batch and array scripts from the templates in slurm/ (pure functions)
  submission.py    a job's plan (its script, rendered and `bash -n` checked) + sbatch + the index entry
  index.py         jaxlaunch's job id -> run directory index (~/.jaxlaunch/jobs)
  fit.py           does a request fit the cluster's partitions and nodes (submit's check, explain)
  array.py         a sweep as job arrays (and its plan); array_status.py: its tasks' states
  status.py        Slurm's part of `jaxlaunch status`: the jobs it lists, its table, its words
  explain.py       `explain --target slurm`: where the ranks run, the container command, the verdict
  doctor.py        `jaxlaunch doctor`'s rows: Slurm's commands and controller
  allocation.py    the in-job side: what the supervisor inside a batch job asks of Slurm
  batch.py         `python -m launcher.backends.slurm.batch`: the supervisor a batch script runs
  requeue.py       a preempted or cancelled job: classify the notice, count requeues, requeue
  nodes.py         the allocation's nodes: lost nodes, the health check
"""

from .backend import SlurmBackend
from .job import SlurmJob

__all__ = ["SlurmBackend", "SlurmJob"]
