"""The Python API (launcher.run) refuses before anything runs: a JobSpec takes no overrides. Handles
on real local runs are in tests/e2e/test_api.py."""

import pytest

import launcher
from conftest import JOBS
from launcher.errors import UsageError


def test_a_jobspec_takes_no_overrides(tmp_path):
    spec = launcher.load_spec(JOBS / "normalize.yaml")
    with pytest.raises(UsageError, match="overrides apply to a spec file"):
        launcher.run(spec, overrides=["nodes=2"], run_dir=tmp_path / "run")
