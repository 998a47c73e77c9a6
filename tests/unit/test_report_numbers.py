"""`ctx.report(step)` with a NumPy or JAX integer step (a Flax TrainState.step is a JAX integer):
the step reaches metrics.jsonl as a JSON number, and the readers (progress, metrics, goodput,
`jaxlaunch status`) also take the string steps that earlier versions wrote."""

import json
import time

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

from launcher import environment
from launcher.rank import channel as rank_channel
from launcher.supervisor import channel as supervisor_channel
from launcher.rundir import metrics as user_progress
from launcher.cli import main
from launcher.rundir.goodput import goodput
from launcher.rundir import RunDirectory
from launcher.rank.progress import ProgressReporter
from launcher.spec import JobSpec


@pytest.mark.parametrize("kind", ["numpy", "jax", "0-d array", "jax 0-d array"])
def test_steps_of_array_types_reach_metrics_jsonl_as_numbers(tmp_path, kind):
    as_step = {"numpy": np.int64, "jax": jnp.int32, "0-d array": np.array,
               "jax 0-d array": lambda s: jnp.asarray(s) + 0}[kind]
    run = RunDirectory(tmp_path / "run")
    run.logs.mkdir(parents=True)
    with supervisor_channel.ControlServer(run, size=2) as server:
        env = server.env()
        ranks = [rank_channel.ControlClient.connect(env[environment.CONTROL_ENV], env[environment.CONTROL_TOKEN_ENV], r)
                 for r in (0, 1)]
        reporters = [ProgressReporter(rank=r) for r in (0, 1)]
        for step in range(3):
            for reporter in reporters:
                reporter.report(as_step(step), total=as_step(10), loss=np.float32(1.0) / (step + 1))
            time.sleep(0.01)
        for client, reporter in zip(ranks, reporters):
            client.send("progress", reporter.take())
        deadline = time.monotonic() + 20
        while len(run.metrics_file.read_text().splitlines() if run.metrics_file.exists() else []) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    lines = [json.loads(line) for line in run.metrics_file.read_text().splitlines()]
    assert [line["step"] for line in lines if line["kind"] == "metrics"] == [0, 1, 2]
    for line in lines:
        assert type(line["step"]) is int and type(line["total"]) is int, line
        if line["kind"] == "rank":
            assert type(line["step_seconds"]) is float, line
    progress = user_progress.progress(run.path)
    assert progress.step == 2 and progress.total == 10 and progress.line().startswith("step 2/10 (20%)")


def write_string_steps(run: RunDirectory):
    """metrics.jsonl as jaxlaunch wrote it for a JAX step ("step" and "step_seconds" as strings): an
    attempt that reported steps 0-3 at 100-103 s, then one that restored step 2 and reported 2-3 again."""
    lines = [{"kind": "metrics", "step": str(s), "time": 100.0 + s, "total": 10, "metrics": {"loss": 1.0 / (s + 1)}}
             for s in range(4)]
    lines += [{"kind": "metrics", "step": str(s), "time": 108.0 + s, "total": 10, "metrics": {"loss": 0.1}}
              for s in (2, 3)]
    lines += [{"kind": "rank", "rank": r, "step": "3", "time": 109.0, "total": 10, "step_seconds": "1.0"}
              for r in (0, 1)]
    run.metrics_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    events = [{"time": 99.0, "event": "attempt_started", "attempt": 0}, {"time": 100.0, "event": "main_started"},
              {"time": 104.0, "event": "attempt_ended", "attempt": 0},
              {"time": 106.0, "event": "attempt_started", "attempt": 1}, {"time": 107.0, "event": "main_started"},
              {"time": 107.5, "event": "restored", "step": 2}, {"time": 110.0, "event": "attempt_ended", "attempt": 1}]
    run.events_file.write_text("".join(json.dumps(e) + "\n" for e in events))


def test_readers_take_the_string_steps_earlier_versions_wrote(tmp_path, monkeypatch):
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    run.update_status(state="COMPLETED", backend="local", started=99.0, ended=110.0)
    write_string_steps(run)

    progress = user_progress.progress(run.path)
    assert progress.step == 3 and progress.rank_step_seconds == {0: 1.0, 1: 1.0}
    assert progress.steps_per_second == pytest.approx(1.0)
    assert [r["step"] for r in user_progress.metrics(run.path)] == [0, 1, 2, 3, 2, 3]
    spent = goodput(run.path)
    assert spent.steps_recomputed == 2 and spent.seconds["work lost"] == pytest.approx(2.0)

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["status", str(run.path), "-v"])
    assert result.exit_code == 0, result.output
    assert "rank 0: 1000.00 ms/step" in result.output
