"""The function API (launcher.Executor) refuses before anything runs: a capture that cannot be
pickled, a bad executor field (the spec error a file gets); an executor takes a spec file, its
overrides and fields; a rank refuses a pickle from another Python minor version. Functions run under
a real mpirun in tests/e2e/test_function_api.py."""

import threading

import pytest

import launcher


def test_an_unpicklable_capture_is_refused_before_submission_naming_it(in_tmp):
    lock = threading.Lock()

    def uses_a_lock(ctx):
        with lock:
            return 1

    with pytest.raises(launcher.errors.UsageError) as caught:
        launcher.Executor("local").submit(uses_a_lock)
    message = str(caught.value)
    assert "the closure variable 'lock' of the function" in message and "_thread.lock" in message
    assert "nothing was submitted" in message
    assert not (in_tmp / "runs").exists()
    with pytest.raises(launcher.errors.UsageError, match=r"argument 1 is a .*socket"):
        import socket

        with socket.socket() as sock:
            launcher.Executor("local").submit(lambda ctx, a, b: 1, 1, sock)


def test_a_bad_executor_field_is_the_spec_error_a_file_gets():
    with pytest.raises(launcher.errors.SpecError, match=r"nodes.*at least 1"):
        launcher.Executor("local", nodes=0).job_spec(lambda ctx: 1)
    with pytest.raises(launcher.errors.SpecError, match=r"nodez: unknown key(.|\n)*did you mean 'nodes'"):
        launcher.Executor("local", nodez=2).job_spec(lambda ctx: 1)


def test_an_executor_takes_a_spec_file_its_overrides_and_fields_and_ignores_its_entrypoint():
    from conftest import EXAMPLES
    from launcher.rank.function_job import ENTRYPOINT

    executor = launcher.Executor("local", spec=EXAMPLES / "normalize.yaml", overrides=["processes_per_node=3"],
                                 timeout="10m")
    spec = executor.job_spec(lambda ctx: 1)
    assert spec.entrypoint == ENTRYPOINT and spec.name == "normalize"  # the file's name, not the function's
    assert spec.processes_per_node == 3 and spec.timeout == 600
    assert launcher.Executor("local").job_spec(test_a_bad_executor_field_is_the_spec_error_a_file_gets).name == \
        "test_a_bad_executor_field_is_the_spec_error_a_file_gets"
    assert launcher.Executor("local").job_spec(lambda ctx: 1).name == "lambda"


def test_a_pickle_from_another_patch_release_of_this_python_runs_and_one_from_another_minor_is_refused(tmp_path):
    """Pickles are compatible across a minor version's patch releases (a node a patch behind the
    login node is common): only major.minor is compared (issue 55)."""
    import sys

    from launcher.rank.function_job import FunctionVersionError, check_versions

    major, minor, micro = sys.version_info[:3]
    check_versions({"python": f"{major}.{minor}.{micro + 1}", "jaxlaunch": launcher.__version__}, tmp_path)
    with pytest.raises(FunctionVersionError, match=rf"Python {major}\.{minor + 1}\.{micro} there"):
        check_versions({"python": f"{major}.{minor + 1}.{micro}", "jaxlaunch": launcher.__version__}, tmp_path)
