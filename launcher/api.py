"""The Python API for scripts and notebooks: start a job, get a handle, follow it.

    import launcher

    job = launcher.run("jobs/examples/normalize.yaml", overrides=["nodes=2"])     # local, under mpirun
    job.wait()                     # JobState.COMPLETED (a str: "COMPLETED"), FAILED, TIMEOUT, ...
    job.result()                   # what the entrypoint returned (waits; JobFailedError if it failed)

    job = launcher.submit("jobs/examples/train_data_parallel.yaml")            # Slurm
    job.state(); job.logs(rank=0); job.cancel(); job.failure()

The handles are the backends' (launcher/backends/): the same ones `jaxlaunch status/logs/cancel`
use. A local job runs in a process of its own (`python -m launcher.backends.local.background RUN_DIR`), so the
caller's process (a notebook kernel) keeps its signal handlers and never imports JAX for it; its
output goes to RUN_DIR/output.log.
"""

from __future__ import annotations

from .backends import RUN_DEFAULT, SUBMIT_DEFAULT, find_job, get_backend
from .backends.base import Job
from .errors import UsageError


def _load(spec, overrides):
    from .spec import JobSpec, load_spec

    if isinstance(spec, JobSpec):
        if overrides:
            raise UsageError("overrides apply to a spec file; pass the file's path, or change the JobSpec itself "
                             "(spec.replace(nodes=2, ...))")
        return spec
    return load_spec(spec, list(overrides))


def run(spec, overrides=(), run_dir=None) -> Job:
    """Start `spec` (a path or a JobSpec) on this machine, as `jaxlaunch run` does; returns at once."""
    return get_backend(RUN_DEFAULT).start(_load(spec, overrides), run_dir)


def submit(spec, overrides=(), run_dir=None, check: bool = True, backend: str = SUBMIT_DEFAULT) -> Job:
    """Submit `spec` (a path or a JobSpec) to `backend` (Slurm unless named: any backend of the
    registry, launcher.backends), as `jaxlaunch submit` does (the same check against the cluster
    first, unless check=False); returns the handle."""
    return get_backend(backend).start(_load(spec, overrides), run_dir, check=check)


def job(job_id_or_run_dir) -> Job:
    """A handle on an earlier job: a Slurm job id, or a run directory. UnknownJobError for an id
    that neither its scheduler nor jaxlaunch's records know (as `jaxlaunch status ID` says)."""
    handle = find_job(job_id_or_run_dir)
    if handle.run is None and not handle.exists():
        raise get_backend(handle.backend).unknown_jobs([handle.id])
    return handle
