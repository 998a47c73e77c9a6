"""The tutorials' commands as the tests run them, and what each page shows them printing: a page's
```console commands run in one bash session (run_page), and the output snippet each page includes
(docs/snippets/output/PAGE.txt) checked against what they printed now (check_output_snippet).
The unit tier checks the pages and snippets (tests/unit/test_docs.py); the pages run in
tests/e2e/test_docs_tutorials.py and, on the test cluster, tests/slurm/test_docs_slurm.py."""

import difflib
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def console_commands(page: Path) -> list[str]:
    """The `$ ` lines of a page's ```console blocks, in order."""
    commands, inside = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```console"
            continue
        if inside and line.startswith("$ "):
            commands.append(line[2:])
    return commands


def run_page(page: Path, workdir: Path, env=None, links=("jobs", "tests")) -> subprocess.CompletedProcess:
    """Every command of the page in one bash session (so `&`, `$!` and `wait` work as typed), in a
    working directory that sees the repository's jobs/ and tests/ as a user's clone would. stdout
    holds stdout and stderr together, as a terminal shows them, each command's output after a line
    COMMAND_MARK + the command (split_transcript splits them)."""
    for name in links:
        (workdir / name).symlink_to(ROOT / name)
    script = "set -euo pipefail\n" + "\n".join(f"printf '%s\\n' {shlex.quote(COMMAND_MARK + c)}\n{c}"
                                                for c in console_commands(page))
    bin_dir = str(Path(sys.executable).parent)
    environment = {**(env or os.environ), "PATH": f"{bin_dir}:{(env or os.environ)['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600, env=environment)


# --- What a tutorial shows each command printing ---------------------------------------------------
# In a page's ```console block, each `$ ` line is followed by the include of that command's output:
#     $ jaxlaunch status runs/first
#     --8<-- "docs/snippets/output/first-job.txt:cmd2"
# The file holds the output of one run of the test that runs the page, with this machine's paths and
# host name replaced, very long lines cut and long runs of rank log lines shortened. Every later run
# is compared with it: the same lines must come out, numbers (times, losses, steps, job ids) aside.
# With JAXLAUNCH_UPDATE_DOCS_OUTPUT=1 the test rewrites the file instead.

OUTPUT_DIR = ROOT / "docs" / "snippets" / "output"
UPDATE_OUTPUT = "JAXLAUNCH_UPDATE_DOCS_OUTPUT"
COMMAND_MARK = "\x1f$ "    # precedes a command's output in a transcript; no command prints it
CUT = " [...]"             # ends a line cut short in the snippet
ELIDED = "[...]"           # stands for the rank log lines left out of a long run of them
LONGEST_LINE = 150         # longer lines are cut there (a result's JSON, explain's environment line)
RANK_LINES_KEPT = 4        # rank log lines kept at each end of a longer run
RANK_LINE = re.compile(r"\[rank \d+\] ")
CARETS = re.compile(r"(\[rank \d+\] )?\s*[~^]+\s*")   # a traceback's markers: they differ between Pythons
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
# A job's state before its end depends on timing: submit --wait's lines for those states come and go,
# and status shows whichever it finds.
PASSING_STATE = re.compile(r"\b(PENDING|CONFIGURING|RUNNING|COMPLETING)\b")
PASSING_STATE_LINE = re.compile(r"job [\d_]+: (PENDING|CONFIGURING|RUNNING|COMPLETING)\b.*")
# pip's complaint about this machine's own package index settings (the container build prints it).
PIP_LOCATION_WARNING = re.compile(r"WARNING: Location '.*' is ignored: it is neither a file nor a directory\.")
SECTION = re.compile(r"--8<-- \[(start|end):(cmd\d+)\]")
INCLUDE = re.compile(r'--8<-- "([^"]+)"')


def output_file(page: str) -> Path:
    return OUTPUT_DIR / f"{Path(page).stem}.txt"


def output_includes(page: Path) -> list[tuple[str, str | None]]:
    """(command, what the next line of its ```console block includes, or None) for each `$ ` line."""
    pairs, inside = [], False
    lines = page.read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("```"):
            inside = line.strip() == "```console"
        elif inside and line.startswith("$ "):
            include = INCLUDE.fullmatch(lines[number + 1].strip()) if number + 1 < len(lines) else None
            pairs.append((line[2:], include and include.group(1)))
    return pairs


def split_transcript(text: str) -> list[tuple[str, list[str]]]:
    """run_page's output as (command, its output lines) in order."""
    sections = []
    for line in text.splitlines():
        if line.startswith(COMMAND_MARK):
            sections.append((line[len(COMMAND_MARK):], []))
        elif sections:
            sections[-1][1].append(line.rstrip())
    return sections


def sanitize(lines: list[str], workdir: Path) -> list[str]:
    """This machine's paths and host name as a user's would read: the working directory and the
    checkout are /home/me/jaxlaunch (the page's commands run in a clone), the host is myhost; lines
    about this machine's pip settings are left out."""
    clone = "/home/me/jaxlaunch"
    places = {str(workdir): clone, str(workdir.resolve()): clone, str(ROOT): clone,
              str(Path(sys.executable).parent.parent): f"{clone}/.venv"}
    host = socket.gethostname().split(".")[0]
    out = []
    for line in lines:
        if PIP_LOCATION_WARNING.fullmatch(line):
            continue
        for place in sorted(places, key=len, reverse=True):
            line = line.replace(place, places[place])
        out.append(re.sub(rf"\b{re.escape(host)}\b", "myhost", line) if host else line)
    return out


def condense(lines: list[str]) -> list[str]:
    """What the page shows of a command's output: lines over LONGEST_LINE cut, and of a run of rank
    log lines longer than 2 x RANK_LINES_KEPT + 1, its first and last RANK_LINES_KEPT."""
    out, run = [], []

    def end_run():
        keep = RANK_LINES_KEPT
        out.extend(run if len(run) <= 2 * keep + 1 else [*run[:keep], ELIDED, *run[-keep:]])
        run.clear()

    for line in lines:
        if len(line) > LONGEST_LINE:
            line = line[:LONGEST_LINE].rstrip() + CUT
        if RANK_LINE.match(line):
            run.append(line)
        else:
            end_run()
            out.append(line)
    end_run()
    return out


def render_output_file(page: str, sections: list[tuple[str, list[str]]]) -> str:
    lines = [f"# What each command of docs/{page} printed, from one run of the test that runs it",
             f"# ({UPDATE_OUTPUT}=1 rewrites this file). The page includes each command's section.", ""]
    for number, (command, output) in enumerate(sections, 1):
        lines += [f"$ {command}", f"--8<-- [start:cmd{number}]", *condense(output), f"--8<-- [end:cmd{number}]", ""]
    return "\n".join(lines)


def parse_output_file(text: str) -> list[tuple[str, list[str]]]:
    sections, command, inside = [], None, False
    for line in text.splitlines():
        marker = SECTION.fullmatch(line)
        if marker:
            inside = marker.group(1) == "start"
            if inside:
                sections.append((command, []))
        elif inside:
            sections[-1][1].append(line)
        elif line.startswith("$ "):
            command = line[2:]
    return sections


def _masked(line: str) -> str:
    line = re.sub(r"-{2,}", "--", NUMBER.sub("N", PASSING_STATE.sub("STATE", line)))
    return " ".join(line.split())


def _comparable(sections) -> tuple[list[str], list[str]]:
    """The lines that must come out in this order (everything but rank log lines, whose order between
    ranks varies, and which a background job prints during whichever command runs then), and the rank
    log lines; masked, without blank lines, traceback carets, ELIDED or a passing state's line."""
    ordered, ranks = [], []
    for _, lines in sections:
        for line in lines:
            # a rank's blank line ("[rank 1]": seen under load in CI, after pytest's summary) is blank too
            blank = not RANK_LINE.sub("", line.strip() + " ", count=1).strip()
            if blank or line == ELIDED or CARETS.fullmatch(line) or PASSING_STATE_LINE.fullmatch(line):
                continue
            (ranks if RANK_LINE.match(line) else ordered).append(_masked(line))
    return ordered, ranks


def _shows(shown: str, printed: str) -> bool:
    """Whether a (masked) line of the snippet is the (masked) printed line, or its start if cut."""
    if shown.endswith(CUT):
        return printed.startswith(shown[:-len(CUT)].rsplit(" ", 1)[0])
    return shown == printed


def check_output_snippet(page: str, sections: list[tuple[str, list[str]]], workdir: Path) -> None:
    """The page's output snippet against what its commands printed now (or, with
    JAXLAUNCH_UPDATE_DOCS_OUTPUT=1, rewritten from it)."""
    path = output_file(page)
    sections = [(command, sanitize(lines, workdir)) for command, lines in sections]
    again = (f"{UPDATE_OUTPUT}=1 .venv/bin/python -m pytest tests/e2e/test_docs_tutorials.py "
             f"tests/slurm/test_docs_slurm.py -k {Path(page).stem}")
    if os.environ.get(UPDATE_OUTPUT) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_output_file(page, sections))
        return
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: write it with `{again}`, read it, commit it"
    stored = parse_output_file(path.read_text())
    assert [c for c, _ in stored] == [c for c, _ in sections], (
        f"{path.relative_to(ROOT)} shows the output of other commands than docs/{page} runs: `{again}`")
    shown, shown_ranks = _comparable(stored)
    printed, printed_ranks = _comparable(sections)
    if len(shown) != len(printed) or not all(map(_shows, shown, printed)):
        diff = "\n".join(difflib.unified_diff(shown, printed, "the page shows", "the commands printed", lineterm=""))
        pytest.fail(f"docs/{page} shows other output than its commands print now (numbers masked as N):\n{diff}\n"
                    f"If the new output is right, rewrite the snippet with `{again}` and commit it.")
    stale = [line for line in shown_ranks if not any(_shows(line, printed) for printed in printed_ranks)]
    assert not stale, (f"docs/{page} shows rank log lines its job no longer prints (masked): {stale}; "
                       f"rewrite the snippet with `{again}`")


LOCAL_PAGES = {
    "tutorials/first-job.md": ['"values": [0.1', "exit code 2", "hello"],
    "tutorials/preemption.md": ["stopped with exit code 75", "COMPLETED", "productive"],
    "tutorials/sweeps.md": ["best", "final_loss"],
    "tutorials/functions.md": ["psum: 3.0", "'word': 'slurm', 'ranks': 2"],
    "how-to/failure-json.md": ["failed first: RuntimeError", "Traceback"],
}


OUTPUT_PAGES = [*sorted(LOCAL_PAGES), "tutorials/slurm.md", "tutorials/containers.md"]
