"""The smallest real job: every rank imports mpi4jax and lists its devices (what a bare
`mpirun python -c "import jax, mpi4jax; jax.devices()"` does), for jobs/benchmarks/bench_launch.yaml."""

import jax
import mpi4jax  # noqa: F401  (the import is the point: it is part of every mpi4jax job's start)


def main(ctx):
    return {"devices": len(jax.devices()), "rank": ctx.rank}
