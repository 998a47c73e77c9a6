"""The local backend: a job runs under mpirun on this machine, with its supervisor in the process
that started it (or in a background child). Code outside this package uses only what this file
exports (the `Backend` seam, launcher/backends/base.py).

  backend.py      LocalBackend and LocalJob: start, find, follow and cancel a local run
  plan.py         the mpirun command and environment of a local run (its Plan), the checks
                  before it, and where `explain` says the ranks run
  array.py        a local sweep: its configurations run one after another (or N at a time)
  background.py   `python -m launcher.backends.local.background`: the child that supervises
                  one configuration of a local sweep, or a run of the Python API (launcher.run)
"""

from .backend import LocalBackend, LocalJob

__all__ = ["LocalBackend", "LocalJob"]
