"""mpirun moved to launcher/launchers/mpirun.py; kept here only while local/backend.py imports it from here."""

from ..launchers.mpirun import find_mpirun  # noqa: F401
