"""The variables each launcher sets in every rank's environment to tell the rank who it is: one
table for both launchers. launcher/rank/topology.py reads the local rank from it before JAX
starts, and the drill's fault injection (launcher/backends/faults.py) finds a rank's process by it.
Imports nothing: every rank reads it at start."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankVariables:
    """The names under which one launcher gives each rank its place."""

    rank: str        # the rank in the job
    local_rank: str  # the rank among the ranks of its node
    local_size: str  # how many ranks its node has (srun's lists every node's: '4(x2)', '2,1')


MPIRUN = RankVariables(rank="OMPI_COMM_WORLD_RANK", local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
                       local_size="OMPI_COMM_WORLD_LOCAL_SIZE")
SRUN = RankVariables(rank="SLURM_PROCID", local_rank="SLURM_LOCALID", local_size="SLURM_TASKS_PER_NODE")
# Set in a step that srun started: a batch script's own environment has SLURM_LOCALID too (always
# 0), and mpirun's ranks inherit it there, so srun's local rank counts only beside this.
SRUN_STEP = "SLURM_STEP_ID"
# PMIx's own name for the rank, which both launchers' PMIx servers set (prterun's, srun --mpi=pmix).
PMIX_RANK = "PMIX_RANK"
# Every variable that holds a rank's number, mpirun's first.
RANK_NUMBER = (MPIRUN.rank, SRUN.rank, PMIX_RANK)
