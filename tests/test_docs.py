"""Docs that cannot rot: the site builds with --strict (broken links and missing pages fail), the
generated references cover every spec key and command, every spec key is described, the README
stays short and its links resolve, and every command the local tutorials show runs, in order."""

import dataclasses
import os
import re
import shutil
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
    working directory that sees the repository's jobs/ and tests/ as a user's clone would."""
    for name in links:
        (workdir / name).symlink_to(ROOT / name)
    script = "set -euo pipefail\n" + "\n".join(f"echo '>>> {c}' >&2\n{c}" for c in console_commands(page))
    bin_dir = str(Path(sys.executable).parent)
    environment = {**(env or os.environ), "PATH": f"{bin_dir}:{(env or os.environ)['PATH']}"}
    return subprocess.run(["bash", "-c", script], cwd=workdir, capture_output=True, text=True, timeout=600,
                          env=environment)


LOCAL_PAGES = {
    "tutorials/first-job.md": ['"values": [0.1', "exit code 2", "hello"],
    "tutorials/preemption.md": ["stopped with exit code 75", "COMPLETED", "productive"],
    "tutorials/sweeps.md": ["best", "final_loss"],
    "tutorials/functions.md": ["psum: 3.0", "'word': 'slurm', 'ranks': 2"],
    "how-to/failure-json.md": ["failed first: RuntimeError", "Traceback"],
}


@pytest.mark.e2e
@pytest.mark.parametrize("page", sorted(LOCAL_PAGES))
def test_every_command_a_local_tutorial_shows_runs(page, tmp_path):
    commands = console_commands(ROOT / "docs" / page)
    assert commands, f"{page} shows no commands"
    done = run_page(ROOT / "docs" / page, tmp_path)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, f"{page}: a command failed:\n{done.stderr[-4000:]}"
    for expected in LOCAL_PAGES[page]:
        assert expected in done.stdout + done.stderr, f"{page}: {expected!r} not in the output"


def test_every_tutorial_page_with_commands_is_run_by_a_test():
    pages = [p for p in (ROOT / "docs" / "tutorials").glob("*.md") if console_commands(p)]
    tested = {ROOT / "docs" / p for p in LOCAL_PAGES} | {ROOT / "docs" / "tutorials" / "slurm.md"}
    tested |= {ROOT / "docs" / "tutorials" / "containers.md"}  # below, with the image the container tests build
    assert set(pages) <= tested, f"untested tutorial commands in {sorted(set(pages) - tested)}"


@pytest.mark.slurm
def test_every_command_of_the_slurm_tutorial_runs_on_the_test_cluster(slurm_env, tmp_path):
    """In order; `JOBID` is the id the first `submit` printed."""
    for name in ("jobs", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**slurm_env, "PATH": f"{Path(sys.executable).parent}:{slurm_env['PATH']}"}
    job_id, outputs = None, []
    for command in console_commands(ROOT / "docs" / "tutorials" / "slurm.md"):
        if "JOBID" in command:
            assert job_id, f"{command!r} comes before any submit"
            command = command.replace("JOBID", job_id)
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout + done.stderr)
        submitted = re.search(r"Submitted job (\d+)", done.stdout + done.stderr)
        job_id = job_id or (submitted and submitted.group(1))
    text = "\n".join(outputs)
    assert "#SBATCH --nodes=2" in text and '"values": [0.1' in text and "COMPLETED" in text


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
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stderr[-4000:]
    assert '"values": [0.1' in done.stdout
