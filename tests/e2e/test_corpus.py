"""Programs nobody here wrote (tests/corpus/), run both ways and compared: `mpirun -n 2 python PROG`
and `jaxlaunch run PROG -n 2`. A program must not be able to tell them apart: the same exit code,
the same stdout lines on stdout and stderr lines on stderr (less the `[rank N] ` prefixes and
jaxlaunch's own lines), the same files written, and the job ends soon after the program's last
line. The one documented difference (docs/how-to/existing-programs.md): a child a program leaves
running is ended with the job, where mpirun waits for it while it holds mpirun's output pipes."""

import os
import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import TESTS
from program_runs import BIN, run_timed

pytestmark = pytest.mark.e2e
CORPUS = TESTS / "corpus"
RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ")
# jaxlaunch's own lines in a rank's stderr (its logger), which mpirun has no counterpart for
OWN_RANK_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) ")
TQDM_TIMES = re.compile(r"\[[^\]]*\]")  # tqdm's elapsed, remaining and rate: differ run to run
# what differs from run to run in any program's lines: clock times, thread ids and pids (absl's prefix)
CLOCK = re.compile(r"\d\d:\d\d:\d\d[.,]\d+|\b\d{5,}\b")

# A rank that exits non-zero (os._exit(4), sys.exit(3)): mpirun tears the other down, sometimes before
# its line (seen under load in CI for sys: mpirun's side printed the line once, jaxlaunch's twice):
# lines, not counts
TEARDOWN_RACE = {"exit_codes[os]", "exit_codes[sys]"}
# name: (arguments, how long a child it leaves runs: mpirun waits for it, jaxlaunch does not)
PROGRAMS = {
    "logging_config": ([], 0),
    "library_info_quiet": ([], 0),
    "absl_program": (["--steps", "2", "--name", "corpus"], 0),
    "tqdm_loop": ([], 0),
    "tensorboard_writer": ([], 0),
    "mp_pool_fork": ([], 0),
    "mp_pool_spawn": ([], 0),
    "mp_pool_forkserver": ([], 0),
    "futures_pools": ([], 0),
    "own_signal_handlers": ([], 0),
    "atexit_handlers": ([], 0),
    "exit_codes[sys]": (["sys"], 0),
    "exit_codes[os]": (["os"], 0),
    "exit_codes[thread]": (["thread"], 0),
    "writes_files": ([], 0),
    "child_outlives": ([], 8),
}


def program_lines(name, timed_lines, under_jaxlaunch):
    """What the program printed on one stream: a Counter of lines (the order of two ranks' lines
    is not the program's), each `\\r`-redrawn frame a line of its own, and when the last came."""
    found, last = Counter(), 0.0
    in_banner = False
    for when, text in timed_lines:
        for piece in re.split(r"[\r\n]", text):
            if under_jaxlaunch:
                match = RANK_PREFIX.match(piece)
                if match is None:
                    continue  # jaxlaunch's or mpirun's own line
                piece = piece[match.end():]
                if OWN_RANK_LINE.match(piece):
                    continue
            elif re.fullmatch(r"-{20,}", piece.strip()):
                in_banner = not in_banner  # mpirun's framed help message, not the program's
                continue
            if in_banner or not piece.strip():
                continue
            if name == "tqdm_loop":
                piece = TQDM_TIMES.sub("[T]", piece)
            piece = CLOCK.sub("#", piece)
            found[piece] += 1
            last = max(last, when)
    return found, last


def files_written(folder: Path) -> dict[str, str]:
    """Every file under `folder` (but the run directory): its path, digits made '#' where a library
    puts a time or a host in the name (tensorboard's event files), and its text, or its size."""
    written = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or relative.parts[0] == "run":
            continue
        key = re.sub(r"\d+", "#", str(relative)).replace(os.uname().nodename, "HOST")
        written[key] = path.read_text() if path.suffix in (".txt", ".json") else "binary"
    return written


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_cannot_tell_jaxlaunch_from_mpirun(name, tmp_path):
    args, child_seconds = PROGRAMS[name]
    program = CORPUS / f"{name.partition('[')[0]}.py"
    both = {}
    for how in ("mpirun", "jaxlaunch"):
        folder = tmp_path / how
        folder.mkdir()
        if how == "mpirun":
            argv = [str(BIN / "mpirun"), "-n", "2", "--oversubscribe", "--allow-run-as-root",
                    str(BIN / "python"), str(program), *args]
        else:
            argv = [str(BIN / "jaxlaunch"), "run", str(program), "-n", "2", "--run-dir", "run", "--", *args]
        code, lines, ended = run_timed(argv, folder)
        stdout, last_out = program_lines(name, lines["stdout"], how == "jaxlaunch")
        stderr, last_err = program_lines(name, lines["stderr"], how == "jaxlaunch")
        both[how] = dict(code=code, stdout=stdout, stderr=stderr, files=files_written(folder),
                         tail=ended - max(last_out, last_err), raw=lines)
    ours, theirs = both["jaxlaunch"], both["mpirun"]
    said = f"jaxlaunch said:\n{''.join(t for _, t in ours['raw']['stderr'])[-3000:]}"
    assert ours["code"] == theirs["code"], said
    if name in TEARDOWN_RACE:
        assert set(ours["stdout"]) == set(theirs["stdout"]) and set(ours["stderr"]) == set(theirs["stderr"]), said
    else:
        assert ours["stdout"] == theirs["stdout"], said
        assert ours["stderr"] == theirs["stderr"], said
    assert ours["files"] == theirs["files"]
    assert ours["stdout"] or ours["stderr"], "the program printed nothing: the comparison proves little"
    # A generous bound that catches a wait (the old 5 s per output pump, or a child's 8 s), not a speed.
    assert ours["tail"] < 5.0, f"the job ended {ours['tail']:.1f} s after the program's last line"
    if child_seconds:  # mpirun waits for the child that holds its pipes; jaxlaunch ends it with the job
        assert theirs["tail"] > child_seconds - 2 > ours["tail"]
        events = (tmp_path / "jaxlaunch" / "run" / "events.jsonl").read_text()
        assert '"event": "processes_left"' in events and "time.sleep(8)" in events
