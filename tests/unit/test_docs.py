"""Docs that cannot rot: the site builds with --strict (broken links and missing pages fail), the
generated references cover every spec key and command, every spec key is described, the README
stays short and its links resolve, every command the local tutorials show runs, in order, and
prints what the page shows after it; and the built pages read as intended (code scrolls instead of
wrapping, no leaked Click sentinel, layouts stay blocks, the load_result types are a table)."""

import dataclasses
import difflib
import html as htmllib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the generators the site uses)

from launcher.spec.model import SPEC_KEYS  # noqa: E402

MKDOCS = Path(sys.executable).parent / "mkdocs"
needs_mkdocs = pytest.mark.skipif(not MKDOCS.exists(), reason="the docs extra is not installed (pip install -e '.[docs]')")


def test_every_spec_key_has_a_description():
    for prefix, record in SPEC_KEYS.items():
        for name, info in record.fields().items():
            key = ".".join([*prefix, name])
            assert len(info.description.split()) >= 3, f"spec key {key} has no real description"


def test_the_spec_reference_lists_every_field_of_the_model_with_its_type_and_default():
    text = hooks.spec_reference()
    for prefix, record in SPEC_KEYS.items():
        for field in dataclasses.fields(record):
            key = ".".join([*prefix, field.name])
            row = next((line for line in text.splitlines() if line.startswith(f"| `{key}` |")), None)
            assert row is not None, f"{key} is missing from the spec reference"
            assert row.count("|") >= 5 and record.fields()[field.name].description[:30] in row


def test_the_files_reference_lists_every_status_field_and_event():
    import launcher.states as states

    status = hooks.status_reference()
    for field in dataclasses.fields(states.StatusRecord):
        assert f"| `{field.name}` |" in status
    events = dict(hooks.event_rows())
    assert {"checkpoint", "requeue", "restored", "attempt_started", "main_started"} <= set(events)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built as CI builds it (--strict: a broken link, anchor-less page or missing file fails)."""
    if not MKDOCS.exists():
        pytest.skip("the docs extra is not installed")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([str(MKDOCS), "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@needs_mkdocs
def test_the_site_builds_strict_and_its_references_are_generated(site):
    from launcher.cli import main

    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in main.commands:
        assert f"jaxlaunch {command}" in cli, f"the CLI reference lacks `jaxlaunch {command}`"
    spec = (site / "reference" / "spec" / "index.html").read_text()
    assert all(name in spec for record in SPEC_KEYS.values() for name in record.fields())
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "Executor" in api and "should_stop" in api and "allreduce" in api


# A code block shows this many columns whole at 1280 px in Chromium, with both sidebars (measured
# with a ruler line in the built design page: an 88-column line scrolls); the copy button covers the
# last few columns of a block's first line.
CODE_COLUMNS = 86


def _pre_texts(html: str) -> list[str]:
    """The text of every <pre> block of a built page, as it reads (tags left out, entities decoded)."""
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", html, re.S)
    return [htmllib.unescape(re.sub(r"<[^>]+>", "", block)) for block in blocks]


def _section(html: str, start: str, end: str) -> str:
    """The part of a built page from the element with id `start` to the one with id `end`."""
    tail = html[html.index(f'id="{start}"'):]
    return tail[:tail.index(f'id="{end}"')] if f'id="{end}"' in tail else tail


@needs_mkdocs
def test_code_scrolls_instead_of_wrapping_and_the_architecture_diagram_keeps_its_lines(site):
    """Wrapped, a diagram's lines break apart, a table's rows spill over, and a Python line continues
    at column 0, where it reads as bad indentation: code blocks scroll sideways instead."""
    css = re.sub(r"/\*.*?\*/", "", (site / "stylesheets" / "extra.css").read_text(), flags=re.S)
    wraps = re.compile(r"white-space\s*:\s*(pre-wrap|pre-line|normal|break-spaces)"
                       r"|overflow-wrap\s*:\s*(anywhere|break-word)|word-break\s*:\s*break-(all|word)")
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        if re.search(r"\b(pre|code)\b", selector):
            assert not wraps.search(body), f"extra.css wraps code: {selector.strip()} {{{body.strip()}}}"
    source = (ROOT / "docs" / "snippets" / "architecture.md").read_text()
    diagram = re.search(r"```text\n(.*?)```", source, re.S).group(1).splitlines()
    shown = _pre_texts((site / "design" / "index.html").read_text())
    assert any(block.splitlines() == diagram for block in shown), "the design page's diagram is not the snippet's"
    assert max(map(len, diagram)) <= CODE_COLUMNS, f"the diagram is wider than a code block ({CODE_COLUMNS})"


def test_the_hand_written_code_of_the_reference_pages_fits_a_code_block():
    """Code scrolls rather than wraps: what is written for the page itself (not a command run as
    written, nor the output it printed) stays within what a code block shows."""
    for page in ("reference/api.md", "reference/cli.md", "snippets/architecture.md", "tutorials/sweeps.md"):
        fence = None
        for number, line in enumerate((ROOT / "docs" / page).read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = None if fence is not None else line.strip()
            elif fence is not None and fence != "```console":
                assert len(line) <= CODE_COLUMNS, f"docs/{page}:{number}: {len(line)} columns, over {CODE_COLUMNS}"


@needs_mkdocs
def test_the_cli_reference_shows_real_defaults_not_clicks_sentinel(site):
    """mkdocs-click prints `str(option.default)`: Click 8.3+'s UNSET for an option without one."""
    import click

    from launcher.cli import main

    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "Sentinel" not in cli and "UNSET" not in cli
    defaults = re.findall(r"<td>(?:<code>)?([^<]*)(?:</code>)?</td>\s*</tr>", cli)
    assert defaults, "no option table in the CLI reference"
    options = [p for command in main.commands.values() for p in command.params if isinstance(p, click.Option)]
    declared = {str(p.default) for p in options
                if p.default not in (None, False, ()) and "UNSET" not in repr(p.default)}
    assert declared and declared <= set(defaults), f"defaults the CLI reference lacks: {declared - set(defaults)}"
    assert set(defaults) <= declared | {"", "_required"}, f"odd defaults: {set(defaults) - declared}"


@needs_mkdocs
def test_the_files_reference_keeps_the_run_directory_layout_in_rows_and_types_without_backslashes(site):
    files = (site / "reference" / "files" / "index.html").read_text()
    layout = _section(files, "the-run-directory", "statusjson")
    entries = [*re.findall(r"<tr>(.*?)</tr>", layout, re.S), *re.findall(r"<li>(.*?)</li>", layout, re.S),
               *(line for block in _pre_texts(layout) for line in block.splitlines())]
    for name in ("spec.json", "status.json", "logs/rank-N.log", "result.json"):
        assert any(name in entry and len(entry) < 400 for entry in entries), \
            f"the run directory's layout has no row, item or line of its own for {name}"
    assert not any("logs/rank-N.log" in p for p in re.findall(r"<p>(.*?)</p>", layout, re.S)), \
        "the run directory's layout runs into a paragraph"
    assert "\\|" not in files, "a table of the files reference shows `\\|`"
    assert "<code>str | None</code>" in files


@needs_mkdocs
def test_load_result_types_are_a_table_in_the_api_reference_not_a_paragraph(site):
    from launcher.rundir.results import MARKERS

    api = (site / "reference" / "api" / "index.html").read_text()
    section = _section(api, "launcher.rundir.results.load_result", "launcher.rank.checkpoints.load_checkpoint")
    table = re.search(r"<table>.*?</table>", section, re.S)
    assert table, "the load_result section has no table of what result.json holds"
    assert not {m for m in MARKERS if m not in table.group(0)}, "markers missing from the load_result table"
    for page in ("reference/api", "reference/cli", "reference/files"):
        html = (site / page / "index.html").read_text()
        for paragraph in re.findall(r"<p>(.*?)</p>", html, re.S):
            markers = set(re.findall(r"__[a-z]+__", paragraph)) & MARKERS
            assert len(markers) <= 2, f"a paragraph of {page} spells out {len(markers)} result markers: make it a table"


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160, "the README is a front page: the rest goes into docs/"
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    for command in ("jaxlaunch run", "jaxlaunch submit", "jaxlaunch status", "jaxlaunch logs", "jaxlaunch cancel"):
        assert command in readme


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
    lines = [f"# What each command of docs/{page} printed, from one run of tests/test_docs.py",
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
            if not line.strip() or line == ELIDED or CARETS.fullmatch(line) or PASSING_STATE_LINE.fullmatch(line):
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
    again = f"{UPDATE_OUTPUT}=1 .venv/bin/python -m pytest tests/test_docs.py -k {Path(page).stem}"
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


@pytest.mark.parametrize("page", OUTPUT_PAGES)
def test_each_command_a_tutorial_shows_is_followed_by_its_output(page):
    """Each `$ ` line of the page's console blocks is followed by the include of its section of the
    output snippet, which holds those commands' output (the tests that run the page check it)."""
    pairs = output_includes(ROOT / "docs" / page)
    path = output_file(page)
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    stored = parse_output_file(path.read_text())
    assert [command for command, _ in stored] == [command for command, _ in pairs], \
        f"{path.relative_to(ROOT)} is the output of other commands than docs/{page} shows"
    for number, (command, include) in enumerate(pairs, 1):
        assert include == f"{path.relative_to(ROOT)}:cmd{number}", f"docs/{page}: `{command}` lacks its output"


@needs_mkdocs
def test_the_built_tutorials_show_each_commands_output(site):
    for page in OUTPUT_PAGES:
        shown = "\n".join(_pre_texts((site / page.removesuffix(".md") / "index.html").read_text()))
        for command, lines in parse_output_file(output_file(page).read_text()):
            assert f"$ {command}" in shown, f"{page}: `{command}` is not shown"
            for line in filter(str.strip, lines):
                assert line in shown, f"{page} does not show `{line}` (the output of `{command}`)"


def test_an_output_snippet_matches_a_run_that_differs_in_numbers_and_rank_order_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "OUTPUT_DIR", tmp_path)

    def run(seconds, loss, first, second, summary="COMPLETED", step="step"):
        return [("jaxlaunch run x.yaml", [f"[rank {first}] 12:00:{seconds} INFO {step} 0",
                                          f"[rank {second}] 12:00:{seconds} INFO {step} 0",
                                          f"jaxlaunch: job x {summary} in {seconds} s; result: {tmp_path}/r.json",
                                          '{"losses": [' + ", ".join([str(loss)] * 60) + "]}"])]

    monkeypatch.setenv(UPDATE_OUTPUT, "1")
    check_output_snippet("tutorials/x.md", run(2.5, 0.25, 0, 1), tmp_path)
    snippet = (tmp_path / "x.txt").read_text()
    assert "result: /home/me/jaxlaunch/r.json" in snippet and CUT in snippet
    monkeypatch.delenv(UPDATE_OUTPUT)
    check_output_snippet("tutorials/x.md", run(12.25, 0.125, 1, 0), tmp_path)
    with pytest.raises(pytest.fail.Exception, match="shows other output"):
        check_output_snippet("tutorials/x.md", run(2.5, 0.25, 0, 1, summary="FAILED"), tmp_path)
    with pytest.raises(AssertionError, match="no longer prints"):
        check_output_snippet("tutorials/x.md", run(2.5, 0.25, 0, 1, step="epoch"), tmp_path)


@pytest.mark.e2e
@pytest.mark.parametrize("page", sorted(LOCAL_PAGES))
def test_every_command_a_local_tutorial_shows_runs(page, tmp_path):
    commands = console_commands(ROOT / "docs" / page)
    assert commands, f"{page} shows no commands"
    done = run_page(ROOT / "docs" / page, tmp_path)
    print(done.stdout[-6000:])
    assert done.returncode == 0, f"{page}: a command failed:\n{done.stdout[-4000:]}"
    for expected in LOCAL_PAGES[page]:
        assert expected in done.stdout, f"{page}: {expected!r} not in the output"
    check_output_snippet(page, split_transcript(done.stdout), tmp_path)


def test_every_tutorial_page_with_commands_is_run_by_a_test():
    pages = [p for p in (ROOT / "docs" / "tutorials").glob("*.md") if console_commands(p)]
    tested = {ROOT / "docs" / p for p in LOCAL_PAGES} | {ROOT / "docs" / "tutorials" / "slurm.md"}
    tested |= {ROOT / "docs" / "tutorials" / "containers.md"}  # below, with the image the container tests build
    assert set(pages) <= tested, f"untested tutorial commands in {sorted(set(pages) - tested)}"
    assert {str(p.relative_to(ROOT / "docs")) for p in pages} <= set(OUTPUT_PAGES), "a tutorial shows no output"


@pytest.mark.slurm
def test_every_command_of_the_slurm_tutorial_runs_on_the_test_cluster(slurm_env, tmp_path):
    """In order; `JOBID` is the id the first `submit` printed."""
    for name in ("jobs", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    job_id, sections = None, []
    for written in console_commands(ROOT / "docs" / "tutorials" / "slurm.md"):
        command = written
        if "JOBID" in command:
            assert job_id, f"{command!r} comes before any submit"
            command = command.replace("JOBID", job_id)
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}"
        sections.append((written, done.stdout.splitlines()))
        submitted = re.search(r"Submitted job (\d+)", done.stdout)
        job_id = job_id or (submitted and submitted.group(1))
    text = "\n".join("\n".join(lines) for _, lines in sections)
    assert "#SBATCH --nodes=2" in text and '"values": [0.1' in text and "COMPLETED" in text
    check_output_snippet("tutorials/slurm.md", sections, tmp_path)


@pytest.mark.e2e
def test_every_command_of_the_containers_tutorial_runs(charliecloud_image, tmp_path):
    """The build (a rebuild: the image the container tests built, with this working directory as a
    new mount point) and the normalize job in it, under the host's mpirun."""
    # The job's folder is the user's own (the image mounts it at its own path); the build script and the
    # image are the repository's.
    (tmp_path / "jobs").mkdir()
    for name in ("normalize.py", "normalize.yaml"):
        shutil.copy(ROOT / "jobs" / name, tmp_path / "jobs" / name)
    (tmp_path / "jobs" / "container").symlink_to(ROOT / "jobs" / "container")
    done = run_page(ROOT / "docs" / "tutorials" / "containers.md", tmp_path, links=("tests", "build"))
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-4000:]
    assert '"values": [0.1' in done.stdout
    check_output_snippet("tutorials/containers.md", split_transcript(done.stdout), tmp_path)
