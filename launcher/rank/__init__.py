"""Code that runs inside each rank. Kept small, imported late, and independent of the CLI.

`python -m launcher.rank.bootstrap` is what mpirun or srun starts on every rank.
"""
