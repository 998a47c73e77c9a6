"""A third backend through the seam alone: tests/fake_scheduler.py (a spool folder and a process
per job, as a batch system) is registered as `fake` and jobs are started, followed and cancelled
through it with the Python API and the CLI, under a real mpirun, with no change to jaxlaunch."""

import ast
import json
import time

import pytest
from click.testing import CliRunner

from conftest import ROOT

import launcher
from launcher import backends
from launcher.cli import main as cli
from launcher.spec import JobSpec
from launcher.states import JobState

FAKE = ROOT / "tests" / "fake_scheduler.py"


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setitem(backends.BACKENDS, "fake", "fake_scheduler:FakeBackend")
    monkeypatch.setenv("FAKE_SCHEDULER_SPOOL", str(tmp_path / "spool"))
    monkeypatch.chdir(tmp_path)
    return backends.get_backend("fake")


def steady_spec(steps: int, step_seconds: float = 0.1) -> JobSpec:
    return JobSpec(name="fake", entrypoint=str(ROOT / "tests" / "jobs" / "steady.py") + ":main",
                   processes_per_node=2, params={"steps": steps, "step_seconds": step_seconds})


def test_the_fake_backend_uses_the_seam_alone():
    """It imports launcher's public seam and shared pieces, nothing of the local or Slurm backend."""
    imported = set()
    for node in ast.walk(ast.parse(FAKE.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    inside = sorted(m for m in imported if m.startswith(("launcher.backends.local", "launcher.backends.slurm")))
    assert inside == [] and "launcher.backends.base" in imported


def test_a_job_is_started_followed_and_finds_its_result_through_the_seam(fake, tmp_path):
    plan = fake.plan(steady_spec(5), tmp_path / "run")
    assert "the fake scheduler would run" in plan.describe() and "launcher.rank.bootstrap" in plan.describe()
    job = fake.start_plan(plan)
    assert job.id == "fake-1" and job.run_dir == tmp_path / "run"
    seen = []
    assert job.wait(timeout=120, on_change=lambda j, s: seen.append(s)) == JobState.COMPLETED
    assert seen[-1] == JobState.COMPLETED and job.exit_code() == 0
    assert job.result() == {"total": 10.0, "size": 2}
    assert job.progress().step == 4  # ctx.report reached metrics.jsonl through the supervisor
    again = backends.find_job("fake-1")  # routing: the backend claims its own ids
    assert type(again).__name__ == "FakeJob" and again.run_dir == job.run_dir
    assert "[rank 1]" in again.logs() or again.logs(1)  # the supervisor's output, or rank 1's log

    # the CLI, unchanged, follows it too
    result = CliRunner().invoke(cli, ["status", "fake-1"])
    assert result.exit_code == 0, result.output
    assert "fake-1" in result.output and "COMPLETED" in result.output
    result = CliRunner().invoke(cli, ["logs", "fake-1", "--rank", "0"])
    assert result.exit_code == 0 and result.output.strip(), result.output


def test_a_cancel_through_the_seam_ends_the_job_cancelled_with_every_ranks_stacks(fake, tmp_path):
    job = fake.start(steady_spec(600), tmp_path / "run")
    deadline = time.monotonic() + 90
    while not all((job.run_dir / f"ready-rank-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and not job.done(), job.logs()
        time.sleep(0.2)
    assert job.state() == JobState.RUNNING
    result = CliRunner().invoke(cli, ["cancel", job.id])
    assert result.exit_code == 0, result.output
    assert job.wait(timeout=60) == JobState.CANCELLED
    failure = json.loads((job.run_dir / "failure.json").read_text())
    assert failure["reason"] == "cancelled"
    assert sorted(r["rank"] for r in failure["hang"]["ranks"] if r["answered"]) == [0, 1]
    with pytest.raises(launcher.JobFailedError, match="CANCELLED"):
        job.result()
