"""The launcher's two output streams, passed on live: what a rank writes to stdout reaches this
process's stdout and its stderr this process's stderr, as under `mpirun -n N python prog.py`
(a function job's stdout is its result line, so there the ranks' stdout goes to stderr).

Each rank marks the start of its lines with `[rank N] ` (launcher/rank/output.py); the spec's
`output` says how they are shown: `tagged` as they come, `plain` without the prefix, `rank0` only
rank 0's, without the prefix (every rank's log keeps all of its own). Anything else is the
launcher's own (mpirun, srun): kept in logs/launcher.log for the root cause, and shown, except Open
MPI's framed banners ("MPI_ABORT was invoked ...", "prterun has exited due to ..."; their frame is
in launcher/launchers/mpirun.py): the summary says it all, and quotes them when no rank's own error
explains the failure.

Bytes are passed on as they arrive, up to the last line end (a newline or a carriage return); a
rank's unfinished line (a progress bar's frame) at once: the rank marks it with PARTIAL_LINE.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque

from ..launchers.mpirun import BANNER_FRAME, LIBEVENT_WARNING
from ..rank.output import CONTINUED_LINE, PARTIAL_LINE, split_segments
from ..spec.model import OUTPUT_MODES  # noqa: F401  (the modes shown here)
RANK_PREFIX = re.compile(rb"\[rank (\d+)\] ")
# A rank's lines kept from the console (its log has them): gloo says this once per process and
# collective context in every CPU job with jax.distributed, and it means nothing to the person.
# Two of its threads may print it at once, one line cut into the other: any piece of it goes.
NOISE = re.compile(rb"\[Gloo\] Rank \d+ is connected to|peer ranks\. Expected number of connected peer ranks is : \d+")
# JAX's distributed runtime ends a rank whose coordination service failed (mostly: another rank died
# first, and the summary names it) with a check failure. Its own line is shown; what follows until the
# process is gone (absl's native stack, Python's faulthandler dump, Open MPI's signal report, ~45
# lines interleaved on one fd) says nothing to the person: it stays in the rank's log, and the
# console gets one line saying so.
JAX_ABORT = re.compile(rb"client\.h:\d+\] Terminating process because the JAX distributed service detected fatal errors")
JAX_ABORT_END = b"*** End of error message ***"  # Open MPI's signal report's last line


class LauncherOutput:
    """What one launcher's stdout and stderr said: the lines that were its own (not a rank's), for
    the root cause, and when the first of them came. Shared by the two streams' readers."""

    def __init__(self, log_path, keep: int = 400):
        self.lines: deque[str] = deque(maxlen=keep)
        self.first_seen: float | None = None
        self._log = open(log_path, "ab")
        self._lock = threading.Lock()

    def keep(self, line: bytes) -> None:
        """Into launcher.log only: not the launcher's word on the job."""
        with self._lock:
            self._log.write(line)
            self._log.flush()

    def add(self, line: bytes) -> None:
        self.keep(line)
        with self._lock:
            if line.strip():
                self.first_seen = self.first_seen or time.time()
                self.lines.append(line.decode(errors="replace").rstrip("\r\n"))

    def close(self) -> None:
        with self._lock:
            self._log.close()


class StreamForwarder:
    """One stream of the launcher (its stdout or its stderr) to `write` (bytes), as described in the
    module doc."""

    def __init__(self, write, launcher: LauncherOutput, mode: str = "tagged"):
        self.write, self.launcher, self.mode = write, launcher, mode
        self.pending = b""          # bytes of a line not yet classified or not yet ended
        self.line_rank: int | None = None  # the rank whose unfinished line was passed on already
        self.in_banner = False
        self.aborting: dict[int, int] = {}  # rank -> lines of JAX's abort report kept from the console

    def feed(self, data: bytes) -> None:
        data = self.pending + data.replace(b"\0", b"")  # prterun ends its messages with a NUL byte
        segments, self.pending = split_segments(data)  # a line without its end yet waits for it
        for segment in segments:
            if segment.endswith(PARTIAL_LINE + b"\n"):  # a rank's unfinished line, sent as it was
                self._rank_bytes(segment[:-len(PARTIAL_LINE) - 1], finished=False)
            else:
                self._segment(segment)

    def close(self) -> None:
        """End of the stream: what is left is a line without its line end."""
        if self.pending:
            rest, self.pending = self.pending, b""
            self._segment(rest + b"\n")
        for rank in list(self.aborting):
            self._abort_summary(rank)

    def _rank_bytes(self, data: bytes, finished: bool) -> bool:
        """A rank's line, or the rest of one whose start was passed on (both start with its prefix);
        False when `data` is neither."""
        match = RANK_PREFIX.match(data)
        if match and finished and NOISE.search(data, match.end()):
            return True
        if match and finished and self._jax_abort(int(match.group(1)), data[match.end():]):
            return True
        if not match:
            return False  # a rank's bytes always start with its prefix: these are the launcher's
        rank = int(match.group(1))
        if data.startswith(CONTINUED_LINE, match.end()):  # the rest of this rank's unfinished line
            rest = data[match.end() + len(CONTINUED_LINE):]
            if self.line_rank == rank:
                self._show(rank, rest, strip=False)
            else:  # another line came between: the rest starts a console line of its own
                self._end_open_line()
                self._show(rank, data[:match.end()] + rest, strip=True)
        else:
            if self.line_rank != rank:
                self._end_open_line()
            self._show(rank, data, strip=True)
        self.line_rank = None if finished else rank
        return True

    def _end_open_line(self) -> None:
        """Another line starts while a rank's unfinished one is on the console: end that one first,
        so that the two stay apart."""
        if self.line_rank is not None and (self.mode != "rank0" or self.line_rank == 0):
            self._safe_write(b"\n")
        self.line_rank = None

    def _jax_abort(self, rank: int, text: bytes) -> bool:
        """True for a line of JAX's abort report after its first line (kept from the console)."""
        if rank not in self.aborting:
            if JAX_ABORT.search(text):
                self.aborting[rank] = 0
            return False
        self.aborting[rank] += 1
        if text.rstrip().endswith(JAX_ABORT_END):
            self._abort_summary(rank)
        return True

    def _abort_summary(self, rank: int) -> None:
        kept = self.aborting.pop(rank, 0)
        if kept:
            self._show(rank, f"[rank {rank}] (JAX's abort report goes on for {kept} lines: native and Python "
                             f"stacks, in this rank's log)\n".encode(), strip=True)

    def _segment(self, segment: bytes) -> None:
        if self._rank_bytes(segment, finished=True):
            return
        if segment == b"\r":  # a progress bar's redraw, before its next frame
            self._safe_write(segment)
            return
        if LIBEVENT_WARNING.match(segment):  # prterun's, while the job is torn down: launcher.log only
            self.launcher.keep(segment)
            return
        is_frame = BANNER_FRAME.fullmatch(segment.strip()) is not None
        quiet = self.in_banner or is_frame
        self.in_banner = self.in_banner != is_frame  # a frame opens a banner, the next one closes it
        if not quiet:
            self._end_open_line()
            self._safe_write(segment)
        self.launcher.add(segment)

    def _show(self, rank: int, data: bytes, strip: bool) -> None:
        if self.mode == "rank0" and rank != 0:
            return
        if strip and self.mode != "tagged":
            data = RANK_PREFIX.sub(b"", data, count=1)
        self._safe_write(data)

    def _safe_write(self, data: bytes) -> None:
        try:
            self.write(data)
        except (OSError, ValueError):
            pass  # our console went away; the logs still have everything


def forward(fd_or_file, forwarder: StreamForwarder) -> None:
    """Read a launcher's stream to its end and pass it on (a reader thread's body)."""
    fd = fd_or_file if isinstance(fd_or_file, int) else fd_or_file.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        forwarder.feed(chunk)
    forwarder.close()
