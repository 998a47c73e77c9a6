"""`jaxlaunch goodput` and `jaxlaunch plot` of records written by hand: an empty run directory is all
unaccounted, a reported metric is drawn. Real runs (a crash, a preemption and a resume; a sweep) are
in tests/e2e/test_goodput_runs.py."""

import json

import pytest

from conftest import jaxlaunch
from launcher import goodput as gp


def test_goodput_of_an_empty_run_directory_is_all_unaccounted(tmp_path):
    (tmp_path / "status.json").write_text(json.dumps({"submitted": 100.0, "ended": 110.0}))
    result = gp.goodput(tmp_path)
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
