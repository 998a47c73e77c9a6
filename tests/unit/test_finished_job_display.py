"""How a job that has ended is shown: `watch` and `status` count its last step as done (80/80, not
79/80), and the result printed at the end of a run is a short line when result.json is large."""

import json

from rich.console import Console

from launcher.cli.status_table import progress_lines
from launcher.backends.local.backend import LocalJob
from launcher.rundir import RunDirectory
from launcher.spec import JobSpec
from launcher.supervisor.report import result_text
from launcher.cli.watch_view import render


def finished_run(tmp_path, state="COMPLETED", last_step=79):
    run = RunDirectory.create(JobSpec(name="x", entrypoint="m:f"), tmp_path / "run")
    run.update_status(state=state, backend="local", started=100.0, ended=200.0)
    run.metrics_file.write_text("".join(
        json.dumps({"kind": "metrics", "step": s, "time": 100.0 + s, "total": 80, "metrics": {"loss": 0.5}}) + "\n"
        for s in range(last_step + 1)))
    return LocalJob(run)


def screen(job):
    console = Console(width=120, record=True, file=open("/dev/null", "w"))
    console.print(render(job, job.state(), job.progress(), []))
    return console.export_text()


def test_watch_shows_a_completed_job_complete(tmp_path):
    shown = screen(finished_run(tmp_path))
    assert "COMPLETED" in shown and "80/80" in shown and "100%" in shown, shown
    assert "79/80" not in shown and "99%" not in shown and "ETA" not in shown, shown


def test_watch_and_status_of_a_job_that_failed_halfway(tmp_path):
    job = finished_run(tmp_path, state="FAILED", last_step=39)
    shown = screen(job)
    assert "40/80" in shown and "(50%)" in shown and "39/80" not in shown, shown
    lines = []
    progress_lines(job, "runs/x", False, lines.append)
    assert lines[0].startswith("runs/x 40/80 steps (50%)"), lines


def test_status_counts_the_last_step_of_a_completed_job(tmp_path):
    lines = []
    progress_lines(finished_run(tmp_path), "runs/x", False, lines.append)
    assert lines[0].startswith("runs/x 80/80 steps (100%)") and "ETA" not in lines[0], lines


def test_a_small_result_is_printed_whole_and_a_large_one_summarized(tmp_path):
    run = RunDirectory(tmp_path)
    small = {"values": [0.1, 0.2, 0.3, 0.4], "processes": 2, "name": "normalize"}
    run.result_file.write_text(json.dumps(small))
    assert json.loads(result_text(run)) == small
    large = {"first_loss": 2.5, "final_loss": 0.01, "losses": [1.0 / (i + 1) for i in range(500)],
             "config": {"learning_rate": 0.1, "seed": 0}, "devices": 2, "log": "x" * 3000}
    run.result_file.write_text(json.dumps(large))
    assert len(run.result_file.read_text()) > 10_000
    text = result_text(run)
    assert "\n" not in text and len(text) < 600, text
    shown = json.loads(text)  # still one line of JSON
    assert shown["first_loss"] == 2.5 and shown["final_loss"] == 0.01 and shown["devices"] == 2
    assert shown["config"] == {"learning_rate": 0.1, "seed": 0}
    assert "500" in shown["losses"] and "result.json" in shown["losses"]
    assert "3000" in shown["log"]
