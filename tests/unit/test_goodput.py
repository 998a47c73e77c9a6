"""`jaxlaunch goodput` and `jaxlaunch plot` of records written by hand: an empty run directory is all
unaccounted, a reported metric is drawn. Real runs (a crash, a preemption and a resume; a sweep) are
in tests/e2e/test_goodput_runs.py."""

import json

import pytest

from conftest import jaxlaunch
from launcher.cli import goodput_view as gp
from launcher.rundir import goodput as gp_record


def test_goodput_of_an_empty_run_directory_is_all_unaccounted(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"submitted": 100.0, "ended": 110.0}))
    result = gp_record.goodput(tmp_path)
    assert result.wall_seconds == 10.0 and result.steps_recomputed == 0
    assert result.seconds["queued"] == 10.0  # no attempt ever started: it waited in the queue
    pytest.importorskip("matplotlib")
    gp.plot(result, tmp_path / "g.png")
    assert (tmp_path / "g.png").exists()


def test_plot_draws_a_reported_metric_and_names_the_ones_there_are(tmp_path):
    pytest.importorskip("matplotlib")
    lines = [{"kind": "metrics", "step": s, "time": 10.0 + s, "metrics": {"loss": 1.0 / (s + 1)}} for s in range(30)]
    lines += [{"kind": "metrics", "step": s, "time": 50.0 + s, "metrics": {"loss": 0.5 / (s + 1)}}
              for s in range(20, 30)]  # a restart computed 20-29 again: those values win on the step axis
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "spec.json").write_text(json.dumps({"name": "x", "entrypoint": "m:f"}))
    (tmp_path / "status.json").write_text(json.dumps({"state": "COMPLETED", "backend": "local"}))
    shown = jaxlaunch("plot", tmp_path, "loss")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"{tmp_path / 'loss.png'} (30 points)"
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_time = jaxlaunch("plot", tmp_path, "loss", "--x", "time", "--out", tmp_path / "t.png")
    assert by_time.stdout.strip().endswith("(40 points)")
    missing = jaxlaunch("plot", tmp_path, "accuracy")
    assert missing.returncode == 2 and "its metrics: loss" in missing.stderr and "Traceback" not in missing.stderr


def test_the_start_up_budget_splits_each_attempts_way_to_its_first_report():
    """Issue 34: queue wait, launch, imports and MPI, jax.distributed, JAX and devices, preflight,
    restore, compile and first step, from the supervisor's and rank 0's events."""
    from launcher.rundir.goodput import BUDGET_PHASES, start_up_budget

    events = [
        {"event": "attempt_started", "time": 100.0},
        {"event": "main_started", "time": 110.0, "startup": {"process": 101.0, "mpi": 103.0, "jax_distributed": 104.5,
                                                            "devices": 107.0, "preflight": 109.5}},
        {"event": "restored", "time": 111.0, "step": 20, "seconds": 1.0},
        {"event": "first_report", "time": 116.2, "at": 116.0, "compile_seconds": 4.0},
    ]
    budget = start_up_budget(100.0, 90.0, 0.0, events, end=200.0)
    assert [budget[name] for name in BUDGET_PHASES] == [10.0, 1.0, 2.0, 1.5, 2.5, 2.5, 1.0, 4.0, 1.0]
    assert budget["total"] == 16.0
    first = start_up_budget(100.0, None, 7.0, events[:2], end=200.0)  # the first attempt; it never reported
    assert first["queue wait"] == 7.0 and first["compile"] is None and first["total"] is None


def test_a_program_without_devices_or_runtime_marks_leaves_those_phases_out():
    from launcher.rundir.goodput import start_up_budget

    events = [{"event": "main_started", "time": 5.0, "startup": {"process": 1.0, "mpi": 2.0, "preflight": 3.0}},
              {"event": "first_report", "time": 9.0, "at": 9.0, "compile_seconds": 10.0}]
    budget = start_up_budget(0.0, None, 0.0, events, end=20.0)
    assert budget["jax.distributed"] is None and budget["JAX and devices"] is None and budget["preflight"] == 1.0
    assert budget["compile"] == 4.0 and budget["first step"] == 0.0  # never more than main to the first report


def test_a_run_that_never_reported_says_goodput_is_not_measured_instead_of_zero(tmp_path):
    """Issue 44, item 5: a program that never calls ctx.report read '0.0% productive'."""
    from click.testing import CliRunner

    from launcher.cli import main
    from launcher.rundir import RunDirectory
    from launcher.spec import JobSpec

    run = RunDirectory.create(JobSpec(name="x", entrypoint="train.py"), tmp_path / "run")
    run.update_status(state="COMPLETED", backend="local", started=100.0, ended=110.0)
    run.log_event("attempt_started", attempt=0)
    run.log_event("main_started", attempt=0)
    run.log_event("attempt_ended", attempt=0, state="COMPLETED")
    result = CliRunner().invoke(main, ["goodput", str(run.path)])
    assert result.exit_code == 0, result.output
    assert "goodput: not measured: the job never reported a step" in result.output
    assert "% of the wall time was productive steps" not in result.output
    assert not gp_record.goodput(run.path).reported


def test_goodput_says_when_the_governor_stopped_the_job(tmp_path):
    """Issue 45: goodput says what the governor decided."""
    from click.testing import CliRunner

    from launcher.cli import main
    from launcher.rundir import RunDirectory
    from launcher.spec import JobSpec

    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    run.update_status(state="FAILED", backend="local", started=100.0, ended=110.0)
    run.log_event("governor", decision="stopped", why="the program's own exception, twice at the same place")
    result = CliRunner().invoke(main, ["goodput", str(run.path)])
    assert "not tried again: the program's own exception, twice at the same place" in result.output, result.output
