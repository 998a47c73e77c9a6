import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"
TEST_JOBS = Path(__file__).resolve().parent / "jobs"


def jaxlaunch(*args, timeout=180, env=None, cwd=None):
    """Run the installed `jaxlaunch` console script as a user would; returns CompletedProcess."""
    exe = shutil.which("jaxlaunch", path=str(Path(sys.executable).parent)) or "jaxlaunch"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd)


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec file from text; returns its path."""
    def write(text, name="job.yaml"):
        path = tmp_path / name
        path.write_text(text)
        return path
    return write
