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


REGISTERED = "fake=fake_scheduler:FakeBackend"  # the registry's JAXLAUNCH_BACKENDS: no entry point to install


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXLAUNCH_BACKENDS", REGISTERED)
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


# --- the command line, with the fake registered by JAXLAUNCH_BACKENDS only (issue 46) -----------------

def cli_env(tmp_path):
    import os

    return {**os.environ, "JAXLAUNCH_BACKENDS": REGISTERED, "FAKE_SCHEDULER_SPOOL": str(tmp_path / "spool"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))}


def steady_yaml(tmp_path, steps, step_seconds=0.1):
    path = tmp_path / "steady.yaml"
    path.write_text(f"name: steady\nentrypoint: {ROOT / 'tests' / 'jobs' / 'steady.py'}:main\nprocesses_per_node: 2\n"
                    f"params: {{steps: {steps}, step_seconds: {step_seconds}}}\n")
    return path


def test_submit_backend_fake_starts_follows_and_cancels_through_the_cli(tmp_path):
    from conftest import jaxlaunch

    env = cli_env(tmp_path)
    done = jaxlaunch("submit", steady_yaml(tmp_path, 5), "--backend", "fake", "--wait", "--run-dir",
                     tmp_path / "run", env=env, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"total": 10.0, "size": 2}  # --wait: the result on stdout
    assert "Submitted job fake-1" in done.stderr
    shown = jaxlaunch("status", "fake-1", env=env, cwd=tmp_path)
    assert shown.returncode == 0 and "COMPLETED" in shown.stdout, shown.stdout + shown.stderr

    started = jaxlaunch("submit", steady_yaml(tmp_path, 600), "--backend", "fake", "--parsable", "--run-dir",
                        tmp_path / "long", env=env, cwd=tmp_path)
    assert started.returncode == 0 and started.stdout.strip() == "fake-2", started.stderr
    deadline = time.monotonic() + 90
    while not all((tmp_path / "long" / f"ready-rank-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert jaxlaunch("cancel", "fake-2", env=env, cwd=tmp_path).returncode == 0
    deadline = time.monotonic() + 60
    while json.loads((tmp_path / "long" / "status.json").read_text())["state"] != "CANCELLED":
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_run_backend_fake_starts_the_job_there_and_follows_it_in_the_foreground(tmp_path):
    """`run` shares submit's start path: on a backend that runs jobs elsewhere it is submit --wait."""
    from conftest import jaxlaunch

    done = jaxlaunch("run", steady_yaml(tmp_path, 5), "--backend", "fake", "--run-dir", tmp_path / "run",
                     env=cli_env(tmp_path), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"total": 10.0, "size": 2}
    assert "Submitted job fake-1" in done.stderr and "job fake-1: COMPLETED" in done.stderr
    assert json.loads((tmp_path / "run" / "status.json").read_text())["backend"] == "fake"


def test_an_unregistered_backend_is_a_usage_error_naming_the_registry(tmp_path):
    from conftest import jaxlaunch

    refused = jaxlaunch("submit", steady_yaml(tmp_path, 5), "--backend", "fake", cwd=tmp_path)
    assert refused.returncode == 2 and "'fake': choose from local, slurm" in refused.stderr


def test_drill_target_fake_injects_through_the_fake_backend(tmp_path):
    from conftest import EXAMPLES, jaxlaunch

    folder = tmp_path / "drill"
    result = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--target", "fake", "--set", "params.steps=40",
                       "--set", "params.checkpoint_every=10", "--set", "params.step_seconds=0.05", "--seed", "5",
                       "--faults", "kill,hang,repeat", "--run-dir", folder, env=cli_env(tmp_path), cwd=tmp_path,
                       timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((folder / "drill.json").read_text())
    assert report["target"] == "fake" and [t["fault"] for t in report["trials"]] == ["kill", "hang", "repeat"]
    assert all(t["passed"] for t in report["trials"]), report["trials"]
    for trial in report["trials"]:  # each run went through the fake scheduler, not `jaxlaunch run`
        status = json.loads((folder / trial["run_dir"].rpartition("/")[2] / "status.json").read_text())
        assert status["backend"] == "fake" and status["job_id"].startswith("fake-"), status
    refused = jaxlaunch("drill", EXAMPLES / "train_data_parallel.yaml", "--target", "fake", "--faults", "node",
                        env=cli_env(tmp_path), cwd=tmp_path)
    assert refused.returncode == 2 and "node: choose from kill, hang, repeat (node: with --target slurm)" in refused.stderr
