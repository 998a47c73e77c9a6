"""srun's reports moved to launcher/launchers/srun.py; kept here only while allocation.py imports it from here."""

from ...launchers.srun import task_reports  # noqa: F401
