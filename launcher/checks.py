"""A check of this machine (one row of `jaxlaunch doctor`: a status, what was found, the fix) and
the commands that checks run: each is started at once and collected later (`Started`), so the
probes run side by side and the whole report takes about as long as the slowest one. A probe
that crashes or hangs becomes an answer to report (a timeout kills it and what it started).
launcher/cli/doctor_checks/ runs the machine's checks, and each backend its own (Backend.start_doctor_checks)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Mapping

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: str          # OK, WARN or FAIL
    detail: str          # what was found
    fix: str = ""        # what to do about it; empty when status is OK


# --- subprocesses ----------------------------------------------------------------------------

@dataclass
class Outcome:
    returncode: int | None   # None: timed out (and killed)
    stdout: str
    stderr: str
    seconds: float

    def last_error_line(self) -> str:
        lines = [line.strip() for line in (self.stderr or self.stdout).splitlines() if line.strip()]
        return lines[-1] if lines else "no output"

    def json(self) -> dict | None:
        for line in reversed(self.stdout.splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
        return None

    def why_not(self, what: str, timeout: float) -> str:
        """What went wrong, for a probe or command that gave no usable answer."""
        if self.returncode is None:
            return f"{what} did not finish in {timeout:g} s"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"{what} crashed ({name}): {self.last_error_line()}"
        return f"{what} failed (exit code {self.returncode}): {self.last_error_line()}"


class Started:
    """A command started now and collected later, so that the probes run side by side."""

    def __init__(self, argv: list[str], env: Mapping[str, str], timeout: float):
        self.argv, self.timeout = argv, timeout
        self._outcome: Outcome | None = None
        self.started = time.monotonic()
        self.error: OSError | None = None
        try:
            # A session of its own, so a timeout can stop the probe and anything it started.
            self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as error:
            self.process, self.error = None, error

    def outcome(self) -> Outcome:
        """The command's end (waited for once; later calls give the same answer)."""
        if self._outcome is None:
            self._outcome = self._collect()
        return self._outcome

    def _collect(self) -> Outcome:
        if self.process is None:
            return Outcome(127, "", str(self.error), 0.0)
        remaining = max(0.0, self.started + self.timeout - time.monotonic())
        try:
            stdout, stderr = self.process.communicate(timeout=remaining)
            returncode = self.process.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            stdout, stderr = self.process.communicate()
            returncode = None
        return Outcome(returncode, stdout, stderr, time.monotonic() - self.started)


def which(command: str, env: Mapping[str, str]) -> str | None:
    """`command`'s path on `env`'s PATH, None when it is not there."""
    return shutil.which(command, path=env.get("PATH", os.defpath))
