"""Spare nodes (`slurm.spare_nodes: K`): the batch job asks for `nodes + K` nodes, and each attempt's
ranks run on `nodes` of them, named on the launcher's command line (srun --nodelist, mpirun --host).
When a node fails under the job, fails the health check, or holds up a hang, the supervisor starts
the next attempt on the nodes left, a spare in the failed node's place, from the latest checkpoint:
the same Slurm job, no requeue, no wait in the queue. Once the spares are spent, the job is
requeued without the bad nodes as before (nodes.py).

Why inside the allocation: a requeue gives every node back and waits in the queue for a new
allocation, minutes to hours on a busy cluster. A spare costs K idle nodes for the job's life, which
is the trade torchelastic's and NeMo's "hot spare" users make.

Pure functions here; SlurmAllocation (allocation.py) reads Slurm and status.json and calls them.
"""

from __future__ import annotations

import os



def usable(allocated: list[str], left_out) -> list[str]:
    """The allocation's nodes the job may still run on, in Slurm's order."""
    out = set(left_out)
    return [node for node in allocated if node not in out]


def chosen(allocated: list[str], left_out, count: int) -> list[str] | None:
    """The `count` nodes an attempt runs on: the first usable ones (so a swap moves only the failed
    node's ranks). None when fewer than `count` are left."""
    nodes = usable(allocated, left_out)
    return nodes[:count] if len(nodes) >= count else None


def pin(argv: list[str], nodes: list[str], processes_per_node: int) -> list[str]:
    """The launcher's argv with the attempt's nodes named: srun --nodelist=a,b, or mpirun
    --host a:P,b:P (mpirun would otherwise fill the allocation's first nodes, a failed one too)."""
    name = os.path.basename(argv[0]) if argv else ""
    if name == "srun":
        # --ntasks too: srun takes the batch job's SLURM_NTASKS (every node's tasks, spares' too)
        # from its environment and refuses a step of more tasks than its nodes hold.
        return [argv[0], f"--nodelist={','.join(nodes)}", f"--ntasks={len(nodes) * processes_per_node}",
                *argv[1:]]
    if name in ("mpirun", "mpiexec", "prterun"):
        return [argv[0], "--host", ",".join(f"{node}:{processes_per_node}" for node in nodes), *argv[1:]]
    return argv

