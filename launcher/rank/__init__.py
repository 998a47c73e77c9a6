"""Code that runs inside each rank. Kept small, imported late, and independent of the CLI.

`python -m launcher.rank.bootstrap` is what mpirun or srun starts on every rank: it sets up MPI,
the device binding and the supervision, then runs the spec's entrypoint (program.py): a function
with the JobContext, or a script or module as __main__ (which may start jax.distributed itself,
jax_runtime.py). `launcher.context()` (context.py) gives any of them the rank's context.
"""
