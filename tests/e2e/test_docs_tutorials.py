"""Every command the local tutorials (and the how-to pages in HOW_TO_PAGES) show runs, in order, under
mpirun, and prints what the page shows after it (tests/doc_pages.py); the containers tutorial too, in
the image the container tests build. The Slurm tutorial runs in tests/slurm/test_docs_slurm.py; the
site and the pages' snippets are checked in tests/unit/test_docs.py."""

import re
import shutil

import pytest

from conftest import EXAMPLES, ROOT
from doc_pages import LOCAL_PAGES, check_output_snippet, console_commands, run_page, split_transcript

# Run like LOCAL_PAGES, with what each must print; a file such a page shows under a plain name
# (```python title="handler.py"```) is written by one of its commands, and must be what the page shows.
HOW_TO_PAGES = {
    "how-to/existing-programs.md": ["integral of u", "12 passed", "exit code 5", "FAILED test_allreduce.py",
                                    "this call does nothing", "stopped with exit code 75", "identical",
                                    "notice: saving at step", "ctx.rank 3 of 4", "TIMEOUT", "exit code 124"],
}
PAGES = {**LOCAL_PAGES, **HOW_TO_PAGES}
WRITTEN_FILE = re.compile(r'^```\w+ title="([^"/]+)"\n(.*?)^```', re.M | re.S)


@pytest.mark.e2e
@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_command_a_local_tutorial_shows_runs(page, tmp_path):
    commands = console_commands(ROOT / "docs" / page)
    assert commands, f"{page} shows no commands"
    done = run_page(ROOT / "docs" / page, tmp_path)
    print(done.stdout[-6000:])
    assert done.returncode == 0, f"{page}: a command failed:\n{done.stdout[-4000:]}"
    for expected in PAGES[page]:
        assert expected in done.stdout, f"{page}: {expected!r} not in the output"
    for name, shown in WRITTEN_FILE.findall((ROOT / "docs" / page).read_text()):
        assert (tmp_path / name).exists(), f"{page} shows {name}, and no command of it writes it"
        assert (tmp_path / name).read_text() == shown, f"{page} shows another {name} than its commands write"
    check_output_snippet(page, split_transcript(done.stdout), tmp_path)


@pytest.mark.e2e
def test_every_command_of_the_containers_tutorial_runs(charliecloud_image, tmp_path):
    """The build (a rebuild: the image the container tests built, with this working directory as a
    new mount point) and the normalize job in it, under the host's mpirun."""
    # The job's folder is the user's own (the image mounts it at its own path); the build script and the
    # image are the repository's.
    (tmp_path / "jobs" / "examples").mkdir(parents=True)
    for name in ("normalize.py", "normalize.yaml"):
        shutil.copy(EXAMPLES / name, tmp_path / "jobs" / "examples" / name)
    (tmp_path / "launcher").mkdir()  # only the builder's folder: no importable launcher package here
    (tmp_path / "launcher" / "container_image").symlink_to(ROOT / "launcher" / "container_image")
    done = run_page(ROOT / "docs" / "tutorials" / "containers.md", tmp_path, links=("tests", "build"))
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stdout[-4000:]
    assert '"values": [0.1' in done.stdout
    check_output_snippet("tutorials/containers.md", split_transcript(done.stdout), tmp_path)
