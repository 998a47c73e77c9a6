"""Running a program as a person would, timed: for the tests that compare jaxlaunch with mpirun and
python (tests/e2e/test_corpus.py, test_programs_as_themselves.py)."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def run_timed(argv, cwd, timeout=120):
    """Run argv; its stdout and stderr lines, each with when it arrived, and when it ended."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("XLA_FLAGS", None)
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = {"stdout": [], "stderr": []}

    def read(stream, name):
        for raw in iter(stream.readline, b""):
            lines[name].append((time.monotonic() - started, raw.decode(errors="replace")))

    readers = [threading.Thread(target=read, args=(process.stdout, "stdout")),
               threading.Thread(target=read, args=(process.stderr, "stderr"))]
    for reader in readers:
        reader.start()
    try:
        process.wait(timeout)
    finally:
        process.kill()
    ended = time.monotonic() - started
    for reader in readers:
        reader.join(10)
    return process.returncode, lines, ended
