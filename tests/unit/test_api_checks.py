"""The Python API (launcher.run) refuses before anything runs: a JobSpec takes no overrides. Handles
on real local runs are in tests/e2e/test_api.py."""

import pytest

import launcher
from conftest import EXAMPLES
from launcher.errors import UsageError


def test_a_jobspec_takes_no_overrides(tmp_path):
    spec = launcher.load_spec(EXAMPLES / "normalize.yaml")
    with pytest.raises(UsageError, match="overrides apply to a spec file"):
        launcher.run(spec, overrides=["nodes=2"], run_dir=tmp_path / "run")


def test_the_old_documented_path_of_load_checkpoint_still_imports_with_a_deprecation_warning():
    """Issue 44, item 9: job code written against the old API reference failed with
    ModuleNotFoundError after the move to launcher.rank."""
    import importlib
    import sys
    import warnings

    import launcher
    from launcher.rank.checkpoints import load_checkpoint

    assert launcher.load_checkpoint is load_checkpoint and "load_checkpoint" in launcher.__all__
    for name in ("launcher.runtime.checkpoints", "launcher.runtime"):
        sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("launcher.runtime.checkpoints")
    assert old.load_checkpoint is load_checkpoint
    assert any(issubclass(w.category, DeprecationWarning) and "launcher.load_checkpoint" in str(w.message)
               for w in caught)
