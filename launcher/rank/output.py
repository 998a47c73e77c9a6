"""Per-rank output: every byte the rank writes (Python or C code) to fd 1 or 2 goes, live, to the
same fd of the process that started the rank (mpirun or srun passes stdout on as stdout and stderr
as stderr, as they do for `python prog.py`), with a `[rank N] ` prefix at the start of each line,
and to RUN_DIR/logs/rank-N.log in full, without prefixes. The prefix is how the supervisor tells a
rank's lines from the launcher's own; it shows them as the spec's `output` says (supervisor/streams.py).

The bytes are passed on by a small process of its own (this file run as a script, standard library
only), not by a thread of the rank: what a program printed just before `os._exit`, a crash or a
SIGKILL is in the pipe, and a thread dies with the rank before it reads it. The pump ends when the
rank has ended and the pipes are empty, not at end-of-file: a child the program started
(multiprocessing's resource tracker, a pool's workers, a metrics service) inherits fds 1 and 2,
and the pipes may never reach end-of-file while it lives. It runs in a session of its own, so the
launcher's teardown of the rank's process group does not take the rank's last words with it.

Live: what the program flushes is passed on at once, not at the next newline, and a carriage
return starts a line as a newline does, so a tqdm bar that redraws itself with `\\r` redraws on the
console and gets its prefix on every frame in a Slurm log. mpirun (Open MPI 5.0's PRTE, which has
no `--output raw`) holds a rank's output until its next newline, so an unfinished line is sent
with PARTIAL_LINE and a newline after it, and its rest with the prefix and CONTINUED_LINE; the
supervisor takes them off again.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

LINE_ENDS = (b"\n", b"\r")
# Ends what a rank sent of a line it has not finished (with a newline, for mpirun's sake); an OSC
# escape sequence, which a terminal that sees it (a launcher without our supervisor) ignores.
PARTIAL_LINE = b"\x1b]jaxlaunch;partial\x07"
# Starts, after the rank's prefix, the rest of a line whose start went out with PARTIAL_LINE: another
# rank's line may pass between the two, and without its prefix the rest would pass for mpirun's own.
CONTINUED_LINE = b"\x1b]jaxlaunch;continued\x07"
PARENT_POLL_SECONDS = 0.1
PARTIAL_WAIT_SECONDS = 0.05  # how long the start of a line waits for its end before it goes out alone
PUMP_ENV = "JAXLAUNCH_OUTPUT_PUMP"  # in the pump's environment: not a process the program left behind  # without pidfd_open: how often the pump looks whether the rank still lives

_SEGMENT = re.compile(rb"[^\r\n]*[\r\n]")


def split_segments(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete segments (each ending in \\n or \\r) and the rest, which has no line end yet."""
    segments = _SEGMENT.findall(data)
    return segments, data[sum(map(len, segments)):]


class Prefixer:
    """Puts `prefix` at the start of every line of a byte stream that arrives in pieces. A bare
    carriage return at a line's start (tqdm's redraw) gets none: the frame after it does."""

    def __init__(self, prefix: bytes):
        self.prefix = prefix
        self.at_line_start = True

    def __call__(self, data: bytes) -> bytes:
        if not self.prefix:
            return data
        segments, rest = split_segments(data)
        out = []
        for piece in (*segments, rest) if rest else segments:
            if self.at_line_start and piece != b"\r":
                out.append(self.prefix)
            out.append(piece)
            self.at_line_start = piece.endswith(LINE_ENDS)
        return b"".join(out)


class Pump:
    """The pump process's work: pipes (read ends) -> console fds, with prefixes, and the log.

    A line's start without its end waits for its end, so that two ranks' lines stay whole on the
    console, as mpirun keeps them (a program that writes unbuffered, PYTHONUNBUFFERED=1, writes a
    line and its newline apart; pytest writes its dots one by one). A line begun with a carriage
    return is a progress bar redrawing itself: its frame goes out after PARTIAL_WAIT_SECONDS,
    marked as unfinished."""

    def __init__(self, pipes: dict[int, int], consoles: dict[int, int], log_fd: int, prefix: bytes):
        self.pipes, self.consoles, self.log_fd = pipes, consoles, log_fd
        self.prefixers = {fd: Prefixer(prefix) for fd in pipes}
        self.pending = {fd: b"" for fd in pipes}  # the start of a line, not yet passed on
        self.redrawn = {fd: False for fd in pipes}  # the line was begun with a carriage return: a bar
        self.pending_since: dict[int, float] = {}

    def feed(self, fd: int, data: bytes) -> None:
        try:
            os.write(self.log_fd, data)
        except OSError:
            pass
        segments, rest = split_segments(self.pending[fd] + data)
        if segments:
            self._console(fd, b"".join(segments))
            self.redrawn[fd] = segments[-1].endswith(b"\r")
        if rest and (segments or not self.pending[fd]):  # a new line's start: its wait begins
            self.pending_since[fd] = time.monotonic()
        self.pending[fd] = rest

    def flush_partial(self, now: float | None = None) -> float | None:
        """Pass on the unfinished lines that waited long enough (all of them when `now` is None);
        returns how long until the next one is due, or None."""
        due = None
        for fd, rest in self.pending.items():
            if not rest or (now is not None and not self.redrawn[fd]):
                continue  # a line that is not being redrawn waits for its end (pytest's dots stay one line)
            left = PARTIAL_WAIT_SECONDS - (now - self.pending_since[fd]) if now is not None else 0
            if left <= 0:
                self._console(fd, rest)
                self.pending[fd] = b""
            else:
                due = left if due is None else min(due, left)
        return due

    def _console(self, fd: int, data: bytes) -> None:
        prefixer = self.prefixers[fd]
        continued = not prefixer.at_line_start and prefixer.prefix  # this line's start went out unfinished
        data = (prefixer.prefix + CONTINUED_LINE if continued else b"") + prefixer(data)
        if not prefixer.at_line_start:
            data += PARTIAL_LINE + b"\n"
        try:
            os.write(self.consoles[fd], data)
        except OSError:
            pass  # the console went away (the launcher was killed); the log still has it

    def drain(self) -> None:
        """The rank has ended: what is in the pipes now is all of its output."""
        for fd, pipe in self.pipes.items():
            os.set_blocking(pipe, False)
            while True:
                try:
                    chunk = os.read(pipe, 65536)
                except (BlockingIOError, OSError):
                    break
                if not chunk:
                    break
                self.feed(fd, chunk)
        self.flush_partial()

    def run(self, rank_pid: int) -> None:
        try:
            watch = os.pidfd_open(rank_pid)
        except (AttributeError, OSError):
            watch = None
        open_pipes = dict(self.pipes)  # fd -> pipe, until end-of-file
        while open_pipes:
            waiting = [*open_pipes.values(), *([watch] if watch is not None else [])]
            due = self.flush_partial(time.monotonic())
            if watch is None:
                due = PARENT_POLL_SECONDS if due is None else min(due, PARENT_POLL_SECONDS)
            ready, _, _ = select.select(waiting, [], [], due)
            for fd, pipe in list(open_pipes.items()):
                if pipe in ready:
                    chunk = os.read(pipe, 65536)
                    if chunk:
                        self.feed(fd, chunk)
                    else:
                        del open_pipes[fd]
            if (watch is not None and watch in ready) or (watch is None and os.getppid() != rank_pid):
                break  # the rank is gone; a child of it may hold the pipes open for good
        self.drain()
        for fd, prefixer in self.prefixers.items():
            if not prefixer.at_line_start:  # a last line without its newline: end it for the next one
                try:
                    os.write(self.consoles[fd], b"\n")
                except OSError:
                    pass


class RankOutput:
    """The rank's side: fds 1 and 2 into pipes read by the pump process."""

    def __init__(self, log_path: Path, rank: int):
        self.prefix = f"[rank {rank}] ".encode()
        self.log_path = Path(log_path)
        self.saved: dict[int, int] = {}  # fd -> duplicate of the original console fd
        self.pump: subprocess.Popen | None = None

    def start(self) -> "RankOutput":
        sys.stdout.flush()
        sys.stderr.flush()
        pipes = {}
        for fd in (1, 2):
            self.saved[fd] = os.dup(fd)
            pipes[fd] = os.pipe()
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        read_ends = [pipes[1][0], pipes[2][0]]
        argv = [sys.executable, "-I", "-S", __file__, str(os.getpid()), self.prefix.decode(),
                *map(str, [*read_ends, self.saved[1], self.saved[2], log_fd])]
        self.pump = subprocess.Popen(argv, pass_fds=(*read_ends, self.saved[1], self.saved[2], log_fd),
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, PUMP_ENV: "1"})
        os.close(log_fd)
        for fd, (read_end, write_end) in pipes.items():
            os.dup2(write_end, fd)  # fd 1/2 now feed the pipe, for C code too
            os.close(write_end)
            os.close(read_end)
        # Line buffering, so a line reaches the console when printed, not at exit.
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        return self

    def write_direct(self, text: str) -> None:
        """Write to log and console synchronously, bypassing the pipe (used right before an abort,
        when the pump may be ended with the job before it reads the pipe)."""
        data = text.encode(errors="replace")
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            with open(self.log_path, "ab") as log:
                log.write(data)
            os.write(self.saved.get(2, 2), Prefixer(self.prefix)(data))
        except OSError:
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Flush Python's buffers into the pipes; the pump passes them on once the rank has ended."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _pump_main(argv: list[str]) -> None:
    import signal

    rank_pid, prefix = int(argv[0]), argv[1].encode()
    out_pipe, err_pipe, out_console, err_console, log_fd = map(int, argv[2:7])
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):  # it ends with the rank, not before
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    Pump({1: out_pipe, 2: err_pipe}, {1: out_console, 2: err_console}, log_fd, prefix).run(rank_pid)


if __name__ == "__main__":
    _pump_main(sys.argv[1:])
