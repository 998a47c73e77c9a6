"""Slurm backend: render batch scripts, submit and follow jobs."""
