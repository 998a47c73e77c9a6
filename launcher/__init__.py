"""jaxlaunch: run one JAX job spec locally under mpirun or on Slurm.

The public API for job authors is this module's namespace:

    import launcher

    def main(ctx: launcher.JobContext):
        total = launcher.allreduce(local_sums)          # over all devices of all hosts
        ...

Attributes load lazily: importing `launcher` must not import JAX, because each rank sets its
device environment (XLA_FLAGS, CUDA_VISIBLE_DEVICES) before JAX's first import.
"""

__version__ = "0.1.0"

__all__ = ["run", "submit", "job", "Job", "Executor", "allreduce", "broadcast", "allgather", "barrier", "TreePacker", "JobContext", "context", "DEVICE_AXIS", "load_result", "load_checkpoint", "load_spec",
           "JobSpec", "JobState", "JobFailedError", "NoResultError", "__version__"]

_LAZY = {
    "run": "api", "submit": "api", "job": "api", "Job": "api", "Executor": "executor",
    "allreduce": "rank.collectives", "broadcast": "rank.collectives", "allgather": "rank.collectives",
    "barrier": "rank.collectives", "TreePacker": "rank.collectives", "JobContext": "rank.context", "context": "rank.context", "DEVICE_AXIS": "rank.context", "load_result": "rundir.results",
    "load_checkpoint": "rank.checkpoints",
    "load_spec": "spec", "JobSpec": "spec", "JobState": "states", "JobFailedError": "errors", "NoResultError": "errors",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
