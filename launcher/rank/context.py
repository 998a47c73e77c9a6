"""JobContext: what an entrypoint gets. `def main(ctx): ...`"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .topology import DEVICE_AXIS  # noqa: F401  (job code imports it from here)


@dataclass(frozen=True)
class JobContext:
    rank: int                  # global MPI rank
    size: int                  # number of processes
    local_rank: int            # rank among the processes of this node; devices are bound by it
    local_size: int            # processes on this node
    node_index: int            # 0 .. num_nodes-1
    num_nodes: int
    local_devices: list        # the JAX devices this process drives
    mesh: Any                  # jax.sharding.Mesh over local_devices, axis DEVICE_AXIS
    run_dir: Path
    params: dict = field(default_factory=dict)
    attempt: int = 0           # 0 on the first attempt; +1 for each restart, requeue or --resume
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("jaxlaunch.job"))
    checkpoints: Any = None    # launcher.rank.checkpoints.Checkpoints over RUN_DIR/checkpoints
    progress: Any = None       # launcher.rank.progress.ProgressReporter (ctx.report)

    def report(self, step: int, total: int | None = None, **metrics) -> None:
        """Say how far the job has got: `ctx.report(step, loss=loss, total=steps)` on every rank,
        once per step (rank 0's metrics are kept; every rank's step time is). Cheap: no collective,
        no I/O, no device sync (a jax scalar is converted later, off the job's thread). Shown by
        `jaxlaunch status`, `job.progress()`, and kept in RUN_DIR/metrics.jsonl."""
        if self.progress is not None:
            self.progress.report(step, total, **metrics)

    def should_stop(self) -> bool:
        """True on every rank at the same call once any rank got a preemption notice (Slurm's
        time-limit warning or preemption, SIGUSR2). Call it once per step on every rank; when it
        is True, save a checkpoint and return. See launcher/rank/preemption.py."""
        from .preemption import should_stop

        return should_stop()

    @property
    def is_main(self) -> bool:
        """True on rank 0, the rank whose return value becomes result.json."""
        return self.rank == 0

    @property
    def num_local_devices(self) -> int:
        return len(self.local_devices)

    @property
    def global_device_offset(self) -> int:
        """Index of this process's first device in the global device order (all ranks have the same count)."""
        return self.rank * len(self.local_devices)
