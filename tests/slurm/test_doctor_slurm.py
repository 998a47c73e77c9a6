"""`jaxlaunch doctor` against the test cluster (tests/slurm_cluster.py): a running controller is OK.
Its other checks, on this machine and on failures, are in tests/unit/test_doctor.py."""

import pytest

from launcher.cli.doctor_checks import OK, run_checks


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.mark.slurm
def test_a_running_controller_is_ok(slurm_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checks = by_name(run_checks(slurm_env))
    assert checks["slurm controller"].status == OK, checks["slurm controller"]
    assert checks["slurm controller"].detail.startswith("scontrol ping: Slurmctld(primary) at ")
