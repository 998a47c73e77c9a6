"""Every command of docs/tutorials/slurm.md runs on the test cluster (tests/slurm_cluster.py), in
order, and prints what the page shows after it (tests/doc_pages.py)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from doc_pages import check_output_snippet, console_commands


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
