"""Which transport the collectives use for device arrays: 'mpi4jax' (MPI, the default) or 'xla'
(XLA's own collectives over a mesh of every process, xla.py). A rank's bootstrap sets
JAXLAUNCH_TRANSPORT from the spec (JobSpec.collectives_transport: the `transport` key, `auto`
resolved); `using` switches it for a block, so that a benchmark or a test can run both in one job.
NumPy arrays and Python numbers travel over MPI (mpi4py) either way: they are host memory already.
"""

from __future__ import annotations

import contextlib
import os

TRANSPORT_ENV = "JAXLAUNCH_TRANSPORT"
TRANSPORTS = ("mpi4jax", "xla")
_chosen: list[str] = []  # `using` blocks, innermost last


def current() -> str:
    if _chosen:
        return _chosen[-1]
    name = os.environ.get(TRANSPORT_ENV) or "mpi4jax"
    if name not in TRANSPORTS:
        raise ValueError(f"{TRANSPORT_ENV}={name!r}: the collectives' transport is one of {', '.join(TRANSPORTS)}")
    return name


@contextlib.contextmanager
def using(name: str):
    """Run a block's collectives over `name` ('mpi4jax' or 'xla'); every process must switch alike."""
    if name not in TRANSPORTS:
        raise ValueError(f"transport {name!r}: use one of {', '.join(TRANSPORTS)}")
    _chosen.append(name)
    try:
        yield
    finally:
        _chosen.pop()
