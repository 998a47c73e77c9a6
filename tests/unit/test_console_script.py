"""The `jaxlaunch` console script on a bad spec: exit code 2 and the error, no traceback (the jobs
run under mpirun in tests/e2e/test_local_run.py)."""

from conftest import jaxlaunch


def test_bad_spec_through_the_console_script_has_no_traceback(write_spec):
    path = write_spec("name: x\nentrypoint: m:f\nnodez: 2\n")
    result = jaxlaunch("run", path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"Error: {path}:3: nodez: unknown key.")
    assert "Traceback" not in result.stderr
