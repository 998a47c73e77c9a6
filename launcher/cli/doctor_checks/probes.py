"""The probes `jaxlaunch doctor` starts in a subprocess of this Python (each prints one line of JSON),
their time limits, and the JAX row read from one."""

from __future__ import annotations

import sys
from typing import Mapping

from ...checks import FAIL, OK, WARN, Check, Started

PROBE_TIMEOUT = 30.0        # JAX's first import on a cold shared filesystem, or CUDA's start, can be slow
COMMAND_TIMEOUT = 10.0      # mpirun --version, a container runtime's --version

# The probes print one line of JSON (their last line of stdout).
MPI4PY_PROBE = """
import json, mpi4py
mpi4py.rc.initialize = False  # the library's version string needs no MPI_Init
from mpi4py import MPI
print(json.dumps({"mpi4py": mpi4py.__version__, "library": MPI.Get_library_version()}))
"""

MPI4JAX_PROBE = """
import json, os
import mpi4jax
from mpi4jax._src import xla_bridge
found = {"version": mpi4jax.__version__, "cuda": bool(mpi4jax.has_cuda_support()),
         "bridges": sorted(name for name in ("mpi_xla_bridge_cpu", "mpi_xla_bridge_cuda", "mpi_xla_bridge_xpu")
                           if hasattr(xla_bridge, name))}
try:
    from launcher.rank.collectives import transport  # the launcher's own FFI call into mpi4jax
    found["fast_path"] = transport.FAST_PATH
except Exception as error:
    found["fast_path"] = None
    found["fast_path_error"] = f"{type(error).__name__}: {error}"
print(json.dumps(found))
"""

JAX_PROBE = """
import json, jax, jaxlib
devices = jax.devices()
print(json.dumps({"jax": jax.__version__, "jaxlib": jaxlib.__version__, "platform": devices[0].platform,
                  "count": len(devices), "kind": devices[0].device_kind}))
"""


def python_probe(code: str, env: Mapping[str, str]) -> Started:
    return Started([sys.executable, "-c", code], env, PROBE_TIMEOUT)


def jax_check(started: Started, gpu_driver: str | None) -> Check:
    outcome = started.outcome()
    probe = outcome.json() if outcome.returncode == 0 else None
    if probe is None:
        return Check("jax", FAIL, outcome.why_not("import jax; jax.devices()", PROBE_TIMEOUT),
                     "pip install -U jax jaxlib (GPU: pip install -U 'jax[cuda12]')")
    count, kind = probe["count"], probe["kind"]
    detail = (f"jax {probe['jax']}, jaxlib {probe['jaxlib']}: {count} {probe['platform']} "
              f"device{'s' if count != 1 else ''}" + (f" ({kind})" if kind != probe["platform"] else ""))
    if gpu_driver and probe["platform"] == "cpu":
        return Check("jax", WARN, detail + f"; an NVIDIA driver is here ({gpu_driver}) but JAX sees no GPU",
                     "pip install -U 'jax[cuda12]' (platform: gpu specs need it)")
    if probe["platform"] == "cpu":
        detail += "; jaxlaunch run gives each rank devices_per_process CPU devices"
    return Check("jax", OK, detail)


