"""The function API as a notebook would use it: a closure on every rank of a 2-process job, its
psum back, and a map over items. Run it: `python jobs/examples/function_example.py` (local; pass "slurm" as
the first argument to submit to Slurm instead)."""

import sys

import numpy as np

import launcher


def main(backend: str = "local") -> None:
    weights = np.arange(4.0)  # captured by the closure: it travels with the function

    def weighted_rank_sum(ctx):
        # runs on every rank; launcher.allreduce sums over every process
        return float(launcher.allreduce(weights[ctx.rank] + 1.0))

    ex = launcher.Executor(backend, processes_per_node=2, timeout="10m")
    job = ex.submit(weighted_rank_sum)
    print("psum:", job.result())                                        # 3.0 = (0 + 1) + (1 + 1)

    jobs = ex.map(lambda ctx, word: {"word": word, "ranks": ctx.size}, ["jax", "on", "slurm"], max_parallel=3)
    print("map:", [j.result() for j in jobs])


if __name__ == "__main__":
    main(*sys.argv[1:])
