"""JobContext: what an entrypoint gets. `def main(ctx): ...`, or `ctx = launcher.context()` in
a script or module that jaxlaunch runs (and in any code they call)."""

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

    def set_result(self, value) -> None:
        """Make `value` the job's result (result.json, `job.result()`), as a function's return
        value is: for a script or module, which returns none. Rank 0's value is kept."""
        RESULT["value"] = value

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


# The rank's context: set by the rank's bootstrap, built on first use for a script or module
# (building it starts JAX's backend, which a program may want to start with jax.distributed first).
_CURRENT: dict = {}
RESULT: dict = {}  # {"value": ...} once set_result was called


def context() -> JobContext:
    """The JobContext of this rank: rank, size, params, checkpoints, report(), should_stop().
    Works in any code that runs under jaxlaunch (a main(ctx) function, a script, a module);
    outside jaxlaunch it raises RuntimeError. A program that calls jax.distributed.initialize()
    itself must call this after it: the context's devices and mesh start JAX's backend."""
    current = _CURRENT.get("context")
    if current is None:
        build = _CURRENT.get("build")
        if build is None:
            raise RuntimeError("launcher.context() works only in a process jaxlaunch started (jaxlaunch run or "
                               "submit); this one was not. Fix: run the program with `jaxlaunch run SPEC` or "
                               "`jaxlaunch run script.py`")
        current = _CURRENT["context"] = build()
    return current


def set_context(value: JobContext | None = None, build=None) -> None:
    """The bootstrap's: the context itself (a function entrypoint), or how to build it on first use."""
    _CURRENT.clear()
    if value is not None:
        _CURRENT["context"] = value
    if build is not None:
        _CURRENT["build"] = build


def context_built() -> bool:
    return "context" in _CURRENT
