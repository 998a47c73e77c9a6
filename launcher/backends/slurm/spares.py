"""Spare nodes (`slurm.spare_nodes: K`): the batch job asks for `nodes + K` nodes, and each attempt's
ranks run on `nodes` of them, named on the launcher's command line (srun --nodelist, mpirun --host:
launchers/srun.py and launchers/mpirun.py).
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


def usable(allocated: list[str], left_out) -> list[str]:
    """The allocation's nodes the job may still run on, in Slurm's order."""
    out = set(left_out)
    return [node for node in allocated if node not in out]


def chosen(allocated: list[str], left_out, count: int) -> list[str] | None:
    """The `count` nodes an attempt runs on: the first usable ones (so a swap moves only the failed
    node's ranks). None when fewer than `count` are left."""
    nodes = usable(allocated, left_out)
    return nodes[:count] if len(nodes) >= count else None
