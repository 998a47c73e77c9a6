"""Per-rank output: every line the rank writes (Python or C code) goes to the console with a
`[rank N]` prefix, live, and to RUN_DIR/logs/rank-N.log in full."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path


class RankOutput:
    def __init__(self, log_path: Path, rank: int):
        self.prefix = f"[rank {rank}] ".encode()
        self.log = open(log_path, "ab", buffering=0)
        self.lock = threading.Lock()
        self.saved = {}  # fd -> duplicate of the original console fd
        self.threads = []

    def start(self) -> "RankOutput":
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            self.saved[fd] = os.dup(fd)
            read_end, write_end = os.pipe()
            os.dup2(write_end, fd)  # fd 1/2 now feed the pipe, for C code too
            os.close(write_end)
            thread = threading.Thread(target=self._pump, args=(read_end, self.saved[fd]), daemon=True)
            thread.start()
            self.threads.append(thread)
        # Line buffering, so a line reaches the console when printed, not at exit.
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        return self

    def _pump(self, read_end: int, console: int) -> None:
        pending = b""
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._emit(line + b"\n", console)
        if pending:
            self._emit(pending + b"\n", console)
        os.close(read_end)

    def _emit(self, line: bytes, console: int) -> None:
        with self.lock:
            self.log.write(line)
            try:
                os.write(console, self.prefix + line)
            except OSError:
                pass  # the console went away (e.g. the launcher was killed); the log still has it

    def write_direct(self, text: str) -> None:
        """Write to log and console synchronously, bypassing the pipe (used right before an abort)."""
        data = text.encode(errors="replace")
        lines = data.splitlines(keepends=True)
        console = self.saved.get(2, 2)
        for line in lines:
            self._emit(line if line.endswith(b"\n") else line + b"\n", console)

    def stop(self, timeout: float = 5.0) -> None:
        """Restore the console fds; the pipes then close and the pump threads drain and end."""
        if not self.saved:
            return
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        for fd, original in self.saved.items():
            os.dup2(original, fd)
        for thread in self.threads:
            thread.join(timeout)
        for original in self.saved.values():
            os.close(original)
        self.saved = {}
        self.log.close()
