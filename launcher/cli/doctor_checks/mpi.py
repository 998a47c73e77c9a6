"""`jaxlaunch doctor`'s MPI rows beyond mpirun's own (which MPI mpirun is and which one mpi4py was
built against: launcher/launchers/mpirun.py, mpi_checks): mpi4jax and its bridges, and the
transport rows (launcher/cli/doctor_checks/transport.py)."""

from __future__ import annotations

from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Started
from .probes import PROBE_TIMEOUT

# --- mpi4jax and JAX ---------------------------------------------------------------------------

def mpi4jax_check(env: Mapping[str, str], started: Started, gpu_driver: str | None) -> Check:
    outcome = started.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return Check("mpi4jax", FAIL, outcome.why_not("importing mpi4jax", PROBE_TIMEOUT),
                     "rebuild it against mpi4py's MPI: pip install --no-deps --force-reinstall --no-cache-dir "
                     "mpi4jax (with that MPI's mpicc on PATH; see the Makefile)")
    parts = [f"mpi4jax {probe['version']}", "bridges: " + (", ".join(probe["bridges"]) or "none")]
    status, fixes = OK, []
    if "mpi_xla_bridge_cpu" not in probe["bridges"]:
        status = FAIL
        fixes.append("reinstall mpi4jax: its CPU bridge (mpi_xla_bridge_cpu) is missing")
    if probe["cuda"]:
        parts.append("CUDA bridge: yes")
    elif gpu_driver:
        status = WARN if status == OK else status
        parts.append(f"no CUDA bridge, but an NVIDIA driver is here ({gpu_driver}): collectives of GPU arrays "
                     "will fail")
        fixes.append("rebuild mpi4jax with CUDA_PATH pointing at the CUDA toolkit (the folder with "
                     "include/cuda_runtime.h): CUDA_PATH=/usr/local/cuda pip install --no-deps --force-reinstall "
                     "--no-cache-dir mpi4jax (see the Makefile)")
    else:
        parts.append("no CUDA bridge (none needed: no GPU here)")
    if probe.get("fast_path"):
        parts.append("launcher fast path: on")
    elif env.get("JAXLAUNCH_ORDERED_MPI4JAX") == "1":
        parts.append("launcher fast path: off (JAXLAUNCH_ORDERED_MPI4JAX=1)")
    else:
        status = WARN if status == OK else status
        why = probe.get("fast_path_error") or "this mpi4jax lacks the FFI target launcher/rank/collectives/transport.py calls"
        parts.append(f"launcher fast path: off ({why}); collectives take mpi4jax's slower public path")
        fixes.append("install the mpi4jax that pyproject.toml pins (mpi4jax>=0.9.1,<0.10)")
    return Check("mpi4jax", status, "; ".join(parts), "; ".join(fixes))


def transport_rows(env, mpirun, gpu_driver, mpi4py_run: Started, mpi4jax_run: Started, spec) -> list[Check]:
    """The CUDA-aware MPI probe (GPU nodes) and the NCCL launch mode: launcher/cli/doctor_checks/transport.py."""
    from .transport import transport_checks

    mpi4jax = mpi4jax_run.outcome().json() or {}
    library = (mpi4py_run.outcome().json() or {}).get("library") or ""
    return transport_checks(env, mpirun, gpu_driver, bool(mpi4jax.get("cuda")), library, spec)


