"""The Slurm toolkit the Slurm backend (launcher/backends/slurm.py) is built from; nothing here
keeps state between calls.

  scheduler.py   the one wrapper that runs every Slurm command, its parsers, the state table, and
                 the batched query (`query_jobs`: at most three commands for any number of jobs)
  render.py      batch and array scripts from the templates in slurm/ (pure functions)
  submission.py  render + `bash -n` check + sbatch + the index entry, for one job
  index.py       jaxlaunch's job id -> run directory index (~/.jaxlaunch/jobs)
  fit.py         does a request fit the cluster's partitions and nodes (submit's check, explain)
"""
