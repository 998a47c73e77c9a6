"""Docs that cannot rot: the site builds with --strict (broken links and missing pages fail), the
generated references cover every spec key and command, every spec key is described, the README
stays short and its links resolve, every tutorial command is followed by its output, and the built
pages read as intended (code scrolls instead of wrapping, no leaked Click sentinel, layouts stay
blocks, the load_result types are a table). The tutorials' commands run in tests/e2e/test_docs_tutorials.py
and tests/slurm/test_docs_slurm.py."""

import dataclasses
import html as htmllib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import doc_pages
from conftest import ROOT
from doc_pages import (CUT, LOCAL_PAGES, OUTPUT_PAGES, UPDATE_OUTPUT, check_output_snippet, console_commands, output_file,
                       output_includes, parse_output_file)

sys.path.insert(0, str(ROOT / "docs"))
import hooks  # noqa: E402  (docs/hooks.py: the generators the site uses)

from launcher.spec.model import SPEC_KEYS  # noqa: E402

# The pages whose commands run with their output shown: doc_pages.OUTPUT_PAGES, and the how-to that
# tests/e2e/test_docs_tutorials.py runs besides them (its HOW_TO_PAGES).
SHOWN_OUTPUT_PAGES = [*OUTPUT_PAGES, "how-to/existing-programs.md"]
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


@pytest.mark.parametrize("page", SHOWN_OUTPUT_PAGES)
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
    for page in SHOWN_OUTPUT_PAGES:
        shown = "\n".join(_pre_texts((site / page.removesuffix(".md") / "index.html").read_text()))
        for command, lines in parse_output_file(output_file(page).read_text()):
            assert f"$ {command}" in shown, f"{page}: `{command}` is not shown"
            for line in filter(str.strip, lines):
                assert line in shown, f"{page} does not show `{line}` (the output of `{command}`)"


def test_an_output_snippet_matches_a_run_that_differs_in_numbers_and_rank_order_only(tmp_path, monkeypatch):
    monkeypatch.setattr(doc_pages, "OUTPUT_DIR", tmp_path)

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


def test_every_tutorial_page_with_commands_is_run_by_a_test():
    pages = [p for p in (ROOT / "docs" / "tutorials").glob("*.md") if console_commands(p)]
    tested = {ROOT / "docs" / p for p in LOCAL_PAGES} | {ROOT / "docs" / "tutorials" / "slurm.md"}
    tested |= {ROOT / "docs" / "tutorials" / "containers.md"}  # below, with the image the container tests build
    assert set(pages) <= tested, f"untested tutorial commands in {sorted(set(pages) - tested)}"
    assert {str(p.relative_to(ROOT / "docs")) for p in pages} <= set(OUTPUT_PAGES), "a tutorial shows no output"


def test_the_existing_programs_page_says_how_a_script_tells_its_rank_and_what_differs_from_python():
    """Issue 43, finding 8: without jax.distributed, jax.process_index() is 0 on every rank, and a
    rank-0 guard built on it let both ranks write the same file; the page did not say to read RANK."""
    page = (ROOT / "docs" / "how-to" / "existing-programs.md").read_text()
    assert "`jax.process_index()` is 0 on every rank" in page
    assert 'if int(os.environ.get("RANK", "0")) == 0:' in page
    assert "## What differs from python, and why" in page and "tests/e2e/test_corpus.py" in page
