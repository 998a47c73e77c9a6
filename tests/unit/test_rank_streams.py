"""A rank's output on its way to the console (launcher/rank/output.py's pump, the supervisor's
streams.py): prefixes at every line start, a carriage-return redraw prefixed on every frame (a tqdm
bar in a Slurm log), an unfinished line passed on live and put back together, the spec's `output`
modes, and the launcher's own lines kept for the root cause. End to end: tests/e2e/test_corpus.py."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import launcher
from launcher.rank import output
from launcher.rank.output import CONTINUED_LINE, PARTIAL_LINE, PARTIAL_WAIT_SECONDS, Prefixer, Pump, split_segments
from launcher.supervisor import streams
from launcher.supervisor.streams import LauncherOutput, StreamForwarder


def test_segments_end_at_newlines_and_carriage_returns():
    assert split_segments(b"a\nb\r\rc") == ([b"a\n", b"b\r", b"\r"], b"c")
    assert split_segments(b"") == ([], b"")


def test_every_frame_of_a_redrawn_bar_gets_the_prefix_once():
    prefix = Prefixer(b"[rank 0] ")
    frames = [prefix(b"\r  0%|"), prefix(b"\r 50%|"), prefix(b"\r100%|"), prefix(b"\n"), prefix(b"done\n")]
    assert b"".join(frames) == b"\r[rank 0]   0%|\r[rank 0]  50%|\r[rank 0] 100%|\n[rank 0] done\n"
    assert prefix(b"half") + prefix(b" a line\n") == b"[rank 0] half a line\n"  # no prefix mid-line


class Console:
    def __init__(self):
        self.read_end, self.write_end = os.pipe()

    def read(self) -> bytes:
        os.set_blocking(self.read_end, False)
        try:
            return os.read(self.read_end, 1 << 16)
        except BlockingIOError:
            return b""


def test_the_pump_holds_a_lines_start_briefly_then_sends_it_marked_as_unfinished(tmp_path):
    """An unbuffered program writes a line and its newline apart: they go out together. A bar's
    frame with no newline goes out after PARTIAL_WAIT_SECONDS, marked, with a newline for mpirun."""
    out, err = Console(), Console()
    log = os.open(tmp_path / "rank-0.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pump = Pump({1: -1, 2: -1}, {1: out.write_end, 2: err.write_end}, log, b"[rank 0] ")
    pump.feed(1, b"a line")
    assert out.read() == b""  # held: its end may be on the way
    pump.feed(1, b"\n")
    assert out.read() == b"[rank 0] a line\n"
    pump.feed(2, b"\r 10%|")
    assert pump.flush_partial(pump.pending_since[2] + 0.01) is not None and err.read() == b"\r"
    assert pump.flush_partial(pump.pending_since[2] + 1.0) is None
    assert err.read() == b"[rank 0]  10%|" + PARTIAL_LINE + b"\n"
    pump.feed(2, b"\r 20%|\n")
    assert err.read() == b"[rank 0] " + CONTINUED_LINE + b"\r[rank 0]  20%|\n"  # the rest says whose it is
    pump.feed(1, b"....")  # pytest's dots: no carriage return, so the line waits for its end
    assert pump.flush_partial(pump.pending_since[1] + 1.0) is None and out.read() == b""
    pump.feed(1, b"s [100%]\n")
    assert out.read() == b"[rank 0] ....s [100%]\n"
    assert (tmp_path / "rank-0.log").read_bytes() == b"a line\n\r 10%|\r 20%|\n....s [100%]\n"  # as written


def test_more_pieces_of_an_unfinished_line_do_not_restart_its_wait(tmp_path, monkeypatch):
    """A bar's frame written in pieces goes out PARTIAL_WAIT_SECONDS after its first piece: a frame
    that keeps growing faster than that is still shown (issue 55)."""
    clock = [0.0]
    monkeypatch.setattr(output, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    err = Console()
    log = os.open(tmp_path / "rank-0.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    pump = Pump({1: -1, 2: -1}, {1: Console().write_end, 2: err.write_end}, log, b"[rank 0] ")
    pump.feed(2, b"\r 10%|#")
    clock[0] = 0.8 * PARTIAL_WAIT_SECONDS
    pump.feed(2, b"##")
    assert pump.flush_partial(1.2 * PARTIAL_WAIT_SECONDS) is None  # due: its first piece came long enough ago
    assert err.read() == b"\r[rank 0]  10%|###" + PARTIAL_LINE + b"\n"


# A rank whose stdout is a pipe (as under mpirun): what it prints must reach its log while it runs.
PRINTS_AND_WAITS = """
import os, sys, time
from pathlib import Path
from launcher.rank.output import RankOutput
log, verdict = Path(sys.argv[1]), Path(sys.argv[2])
buffered = not (sys.stdout.line_buffering or sys.stdout.write_through)  # a pipe: buffered by blocks
RankOutput(log, 0).start()
print("printed")
deadline = time.monotonic() + 20
while b"printed" not in log.read_bytes() and time.monotonic() < deadline:
    time.sleep(0.05)
verdict.write_text(f"{buffered} {b'printed' in log.read_bytes()}")
os._exit(0)  # no flush at exit: only what came through while the rank ran counts
"""


def test_a_ranks_print_reaches_its_log_when_printed_not_at_exit(tmp_path):
    """The rank's stdout is line-buffered once its output is piped to the pump (issue 55)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(Path(launcher.__file__).parent.parent)
    verdict = tmp_path / "verdict"
    subprocess.run([sys.executable, "-c", PRINTS_AND_WAITS, str(tmp_path / "rank-0.log"), str(verdict)], env=env,
                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=True)
    assert verdict.read_text() == "True True"  # block-buffered before start; the line was in the log while it ran


def forwarded(mode="tagged", *chunks, tmp_path):
    shown = []
    launcher = LauncherOutput(tmp_path / "launcher.log")
    forwarder = StreamForwarder(shown.append, launcher, mode)
    for chunk in chunks:
        forwarder.feed(chunk)
    forwarder.close()
    launcher.close()
    return b"".join(shown), list(launcher.lines)


def test_the_supervisor_puts_an_unfinished_line_back_together_and_shows_it_at_once(tmp_path):
    rest = b"[rank 0] " + CONTINUED_LINE
    shown, said = forwarded("tagged", b"[rank 0]  10%|" + PARTIAL_LINE + b"\n", rest + b"\r[rank 0]  20%|" + PARTIAL_LINE,
                            b"\n", rest + b"\n[rank 1] hello\n", tmp_path=tmp_path)
    assert shown == b"[rank 0]  10%|\r[rank 0]  20%|\n[rank 1] hello\n"
    assert said == []  # every line was a rank's


def test_the_launchers_own_lines_are_timed_when_the_first_of_them_came(tmp_path, monkeypatch):
    """The root cause orders the launcher's word against the ranks' failures by this time (issue 55)."""
    clock = [1000.0]
    monkeypatch.setattr(streams, "time", types.SimpleNamespace(time=lambda: clock[0]))
    said = LauncherOutput(tmp_path / "launcher.log")
    said.add(b"\n")
    assert said.first_seen is None  # a blank line says nothing
    clock[0] = 1001.0
    said.add(b"prterun noticed that process rank 1 exited\n")
    clock[0] = 1005.0
    said.add(b"a later line\n")
    said.close()
    assert said.first_seen == 1001.0


@pytest.mark.parametrize("mode, expected", [
    ("tagged", b"\r[rank 1]  50%|\n[rank 0] loss 0.5\n[rank 1]  done\n"),
    ("plain", b"\r 50%|\nloss 0.5\n done\n"),
    ("rank0", b"\rloss 0.5\n"),
])
def test_the_rest_of_a_line_stays_its_ranks_when_another_ranks_line_came_between(mode, expected, tmp_path):
    """Rank 1's bar frame goes out unfinished, rank 0's line passes, then rank 1 ends its line: the
    rest is rank 1's (not mpirun's line, not in launcher.log, not shown as rank 0's)."""
    consoles = {rank: Console() for rank in (0, 1)}
    pumps = {rank: Pump({1: -1}, {1: consoles[rank].write_end}, os.open(tmp_path / f"rank-{rank}.log",
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND), f"[rank {rank}] ".encode()) for rank in (0, 1)}

    def written(rank, data):
        pumps[rank].feed(1, data)
        pumps[rank].flush_partial()  # as after PARTIAL_WAIT_SECONDS
        return consoles[rank].read()

    chunks = [written(1, b"\r 50%|"), written(0, b"loss 0.5\n"), written(1, b" done\n")]
    shown, said = forwarded(mode, *chunks, tmp_path=tmp_path)
    assert said == [] and (tmp_path / "launcher.log").read_bytes() == b""
    assert shown == expected  # and rank 1's bar frame is ended before rank 0's line


@pytest.mark.parametrize("mode, expected", [
    ("tagged", b"[rank 0] a\n[rank 1] b\nmpirun says\n"),
    ("plain", b"a\nb\nmpirun says\n"),
    ("rank0", b"a\nmpirun says\n"),
])
def test_the_output_modes(mode, expected, tmp_path):
    shown, said = forwarded(mode, b"[rank 0] a\n[rank 1] b\nmpirun says\n", tmp_path=tmp_path)
    assert shown == expected
    assert said == ["mpirun says"]


def test_open_mpis_framed_banners_go_to_the_launcher_log_only(tmp_path):
    banner = b"-" * 40 + b"\nMPI_ABORT was invoked\n" + b"-" * 40 + b"\n"
    shown, said = forwarded("tagged", b"[rank 1] boom\n" + banner + b"after\n", tmp_path=tmp_path)
    assert shown == b"[rank 1] boom\nafter\n"
    assert "MPI_ABORT was invoked" in said and "after" in said
    assert b"MPI_ABORT was invoked" in (tmp_path / "launcher.log").read_bytes()


def test_gloos_connected_lines_stay_in_the_ranks_logs_only(tmp_path):
    gloo = b"[rank 1] [Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n"
    cut = (b"[rank 0] [Gloo] Rank 0 is connected to 1[Gloo] Rank 0 is connected to 1 peer ranks. Expected number "
           b"of connected peer ranks is : 1\n[rank 0]  peer ranks. Expected number of connected peer ranks is : 1\n")
    shown, said = forwarded("tagged", gloo + cut + b"[rank 1] loss 0.5\n", tmp_path=tmp_path)
    assert shown == b"[rank 1] loss 0.5\n" and said == []  # also when two threads cut one line into the other


def test_libevents_epoll_warning_in_a_teardown_goes_to_the_launcher_log_only(tmp_path):
    """Seen in CI: prterun's libevent warned '[warn] Epoll MOD(4) on fd 23 failed ... Bad file
    descriptor' as a job with a rank that left main early was torn down; it is no root cause."""
    warning = (b"[warn] Epoll MOD(4) on fd 23 failed. Old events were 6; read change was 0 (none); write change was 2 "
               b"(del); close change was 0 (none): Bad file descriptor\n")
    shown, said = forwarded("tagged", warning + b"mpirun says\n", tmp_path=tmp_path)
    assert shown == b"mpirun says\n" and said == ["mpirun says"]
    assert b"Epoll MOD(4)" in (tmp_path / "launcher.log").read_bytes()


def test_jaxs_abort_report_after_its_own_line_stays_in_the_ranks_log(tmp_path):
    """JAX ends a rank whose coordination service failed (another rank died first) with a check
    failure: its F line is shown, the ~45 lines after it (absl's stack, faulthandler's dump, Open
    MPI's signal report, interleaved) become one line; other ranks' lines pass as they come."""
    abort = (b"[rank 1] E1127 13:10:44.910501 23480 coordination_service_agent.cc:289] Polled an error\n"
             b"[rank 1] F1127 13:10:44.910506 23480 client.h:80] Terminating process because the JAX distributed "
             b"service detected fatal errors. This most likely indicates that another task died\n"
             b"[rank 1] Fatal Python error: Aborted\n[rank 1] \n"
             b"[rank 1] Thread 0x00007f527088bb80 (most recent call first):\n"
             b"[rank 0] a line of rank 0\n"
             b"[rank 1]   File \"/tmp/fail.py\", line 9*** Check failure stack trace: ***\n"
             b"[rank 1]     @     0x7f5254840634  absl::log_internal::LogMessage::SendToLog()\n"
             b"[rank 1] [vm:22555] *** Process received signal ***\n"
             b"[rank 1] [vm:22555] *** End of error message ***\n"
             b"[rank 1] after it\n")
    shown, said = forwarded("tagged", abort, tmp_path=tmp_path)
    assert shown.decode().splitlines() == [
        "[rank 1] E1127 13:10:44.910501 23480 coordination_service_agent.cc:289] Polled an error",
        "[rank 1] F1127 13:10:44.910506 23480 client.h:80] Terminating process because the JAX distributed service "
        "detected fatal errors. This most likely indicates that another task died",
        "[rank 0] a line of rank 0",
        "[rank 1] (JAX's abort report goes on for 7 lines: native and Python stacks, in this rank's log)",
        "[rank 1] after it"]
    assert said == []


def test_an_abort_report_cut_off_by_the_end_of_the_stream_is_still_summed_up(tmp_path):
    abort = (b"[rank 2] F1127 client.h:80] Terminating process because the JAX distributed service detected fatal "
             b"errors.\n[rank 2] *** Check failure stack trace: ***\n[rank 2]     @     0x7f52 f()\n")
    shown, _ = forwarded("plain", abort, tmp_path=tmp_path)
    assert shown.decode().splitlines()[-1] == "(JAX's abort report goes on for 2 lines: native and Python stacks, " \
                                              "in this rank's log)"
